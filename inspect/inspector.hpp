// The inspector of a running job (troupe train --inspect; docs/INSPECT.md): every process serves its
// own ranks over the control plane's TLS-PSK transport (comm/bootstrap/psk_channel.hpp, keyed by the
// job token); rank 0's process listens on the address asked for, writes the inspect file and
// answers for the whole job, asking the other processes' inspectors.
//
// A request is one line: a command word and its arguments ("status", "flight 3", "set lr 1e-4").
// Rank 0's inspector asks the others with "local " + the line: each answers for its own process.
// Every answer is a JSON document; a refused request is {"error": "..."}.
//
// Commands are registered by name (InspectHub::add) by whoever owns the data they show: the job
// (status, where, and the trainer's controls), the flight recorder, the tensor reader... A handler
// runs on the server's thread, one request at a time, while training goes on: it reads what other
// threads publish for it (the ranks' activity boards, the job's control queue), never the ranks'
// own state directly.
#pragma once
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "comm/bootstrap/psk_channel.hpp"
#include "engine/activity.hpp"
#include "troupe/status.hpp"
#include "troupe/train_config.hpp"

namespace troupe {

namespace comm {
class Bootstrap;
}

struct InspectCall {
  std::string line;               // the whole request, without "local "
  std::vector<std::string> args;  // the words after the command
  bool local = false;             // rank 0's inspector asks for this process's part only
};

class InspectHub {
 public:
  // Returns a JSON document (text), or throws nothing: an error is {"error": "..."}.
  using Handler = std::function<std::string(const InspectCall&)>;

  // What the built-in commands read: this process's ranks' boards and the job's iteration.
  InspectHub(std::vector<std::shared_ptr<const ActivityBoard>> boards, const std::atomic<int64_t>* iteration);

  // usage: "flight [RANK]"; help: one line for `help`. Registering a name twice replaces it.
  void add(const std::string& name, const std::string& usage, const std::string& help, Handler handler);
  // A command the inspectors send each other (rank 0's to the others): answered like any, not listed
  // by `help`.
  void add_internal(const std::string& name, const std::string& usage, Handler handler);
  // The answer to a request line (what the server calls).
  std::string answer(const std::string& request) const;

  // Job-wide commands: every other process's answer to "local " + line, parsed; a process that
  // does not answer is listed in `unreachable` ("host:port: why").
  std::vector<std::string> ask_peers(const std::string& line, std::vector<std::string>& unreachable,
                                     std::chrono::milliseconds timeout = std::chrono::milliseconds(2000)) const;
  bool first() const { return first_; }  // rank 0's process

  // This process's ranks, every rank of the job (this process's and the peers').
  std::vector<Activity> local_activities() const;
  std::vector<Activity> job_activities(std::vector<std::string>& unreachable) const;
  int64_t iteration() const { return iteration_->load(); }

  // What `status` adds as "job" for the whole job (a JSON object's text: paused, lr override...).
  void set_job_state(std::function<std::string()> job_state);

  // Set by start_inspector.
  void set_peers(std::vector<std::pair<std::string, int>> peers, std::string token, bool first);

 private:
  struct Command {
    std::string usage, help;
    Handler handler;
    bool internal = false;
  };
  std::vector<std::shared_ptr<const ActivityBoard>> boards_;
  const std::atomic<int64_t>* iteration_;
  mutable std::mutex mu_;  // guards everything below (set while the server already runs)
  std::map<std::string, Command> commands_;
  std::function<std::string()> job_state_;
  std::vector<std::pair<std::string, int>> peers_;
  std::string token_;
  bool first_ = true;
};

// {"error": message}\n
std::string inspect_error(const std::string& message);
// Adds "unreachable": [...] to a JSON answer when some process did not answer.
std::string with_unreachable(std::string json, const std::vector<std::string>& unreachable);

struct InspectServer {
  std::unique_ptr<comm::PskServer> server;
  std::string file;  // rank 0's process only: the inspect file (removed by the caller at the end)
};

// --inspect: starts this process's server for `hub` (nothing when config.inspect is empty) and, in
// rank 0's process, writes the inspect file (mode 0600) and notes the address. Under troupe launch
// the processes exchange their inspectors' addresses through the bootstrap (collective: every
// process calls it).
// dashboard_url: the dashboard's (--dashboard), written into the inspect file too.
Result<InspectServer> start_inspector(const TrainConfig& config, comm::Bootstrap* bootstrap, const std::string& token,
                                      InspectHub& hub, const std::function<void(const std::string&)>& note,
                                      const std::string& dashboard_url = "");

}  // namespace troupe
