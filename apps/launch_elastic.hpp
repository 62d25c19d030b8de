// troupe launch --nnodes MIN:MAX: this node's launcher in the rounds of an elastic job
// (comm/bootstrap/elastic_rendezvous.hpp has the protocol, docs/RESILIENCE.md "Elastic" the story).
// Node 0's launcher hosts the rounds on --master-addr:--master-port (TLS keyed by the job token);
// every other launcher asks there. Each round's ranks meet at the master's port + 1.
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

  // Blocks until this node's next round after `last_round` (-1: its first): its assignment, or
  // nullopt when node 0 says the job has finished without it. Fails after --rdzv-conf join_timeout
  // without a round (naming who was there), or on a refusal. Progress lines every 10 s on stderr.
  Result<std::optional<comm::RoundAssignment>> next_round(int last_round);
  // Node 0: a node asks to join while a round runs without it.
  bool newcomer_waiting() const;
  // Node 0: the job ended (failed: its restarts ran out); nodes still asking hear so for a moment
  // before the launcher exits.
  void finish(bool failed);

 private:
  ElasticMembership() = default;
  Result<std::optional<comm::RoundAssignment>> host_round();
  Result<std::optional<comm::RoundAssignment>> join_round(int last_round);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe::apps
