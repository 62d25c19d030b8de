// troupe launch --nnodes MIN:MAX: this node's launcher in the rounds of an elastic job
// (comm/bootstrap/elastic_rendezvous.hpp has the protocol, docs/RESILIENCE.md "Elastic" the story).
// Node 0's launcher hosts the rounds on --master-addr:--master-port (TLS keyed by the job token);
// every other launcher asks there. Each round's ranks meet at the host's port + 1. When the host
// stops answering, the standby it named hosts the rounds at its own place (the host's run id and
// round number taken over) and the others ask there.
#pragma once
#include <memory>
#include <optional>
#include <string>

#include "apps/cli/launch_options.hpp"
#include "comm/bootstrap/elastic_rendezvous.hpp"

namespace troupe::apps {

class ElasticMembership {
 public:
  // Node 0: starts hosting (refused when the port is taken); others: nothing to start.
  static Result<std::unique_ptr<ElasticMembership>> start(const LaunchOptions& o, const std::string& token,
                                                          const std::string& run_id);
  ~ElasticMembership();

  // Blocks until this node's next round after `last_round` (-1: its first): its assignment (with
  // the host's place, where the round's ranks meet at port + 1), or nullopt when the host says the
  // job has finished without it. Fails after --rdzv-conf join_timeout without a round (naming who
  // was there), or on a refusal. Progress lines every 10 s on stderr. The standby takes over here.
  Result<std::optional<comm::RoundAssignment>> next_round(int last_round);
  // Whether this launcher hosts the rounds (node 0, or a standby that took over).
  bool hosting() const;
  // The host: a node asks to join while a round runs without it.
  bool newcomer_waiting() const;
  // The host: the job ended (failed: its restarts ran out); nodes still asking hear so for a moment
  // before the launcher exits.
  void finish(bool failed);

 private:
  ElasticMembership() = default;
  Result<std::optional<comm::RoundAssignment>> host_round();
  Result<std::optional<comm::RoundAssignment>> join_round(int last_round);
  Status start_hosting(int taken_over_round);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe::apps
