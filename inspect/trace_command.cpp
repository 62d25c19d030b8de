#include "inspect/trace_command.hpp"

#include <memory>
#include <mutex>

#include <nlohmann/json.hpp>

namespace troupe {

namespace {

struct TraceWindow {
  std::mutex mu;
  bool on = false;
  int64_t from = 0;  // the iteration the job had finished at start
  std::string file;  // given at start
};

}  // namespace

void add_trace_command(InspectHub& hub) {
  auto window = std::make_shared<TraceWindow>();
  hub.add("trace", "trace start [FILE] | trace stop [FILE]",
          "a Chrome trace (chrome://tracing, Perfetto) of every rank's passes, waits and reductions from start to stop "
          "(at most the last 64 iterations)",
          [&hub, window](const InspectCall& call) {
            if (call.local || !hub.first()) return inspect_error("trace: ask the inspector of rank 0's process");
            const std::string usage = " (trace start [FILE], then trace stop [FILE])";
            if (call.args.empty() || call.args.size() > 2 || (call.args[0] != "start" && call.args[0] != "stop"))
              return inspect_error("trace needs start or stop" + usage);
            std::lock_guard<std::mutex> lock(window->mu);
            if (call.args[0] == "start") {
              window->on = true;
              window->from = hub.iteration();
              window->file = call.args.size() == 2 ? call.args[1] : "";
              return nlohmann::json{{"tracing", true}, {"from_iteration", window->from}, {"file", window->file}}.dump(1) +
                     "\n";
            }
            if (!window->on) return inspect_error("trace stop: no trace was started" + usage);
            const std::string file = call.args.size() == 2 ? call.args[1] : window->file;
            if (file.empty()) return inspect_error("trace stop needs the file to write (trace stop FILE)");
            window->on = false;
            // This process's ranks as the others answer rank 0's stages, then theirs.
            const std::string ask = "stages --since " + std::to_string(window->from);
            nlohmann::json ranks = nlohmann::json::array();
            std::vector<std::string> unreachable;
            std::vector<std::string> answers = hub.ask_peers(ask, unreachable);
            answers.insert(answers.begin(), hub.answer("local " + ask));
            for (const std::string& answer : answers) {
              const auto j = nlohmann::json::parse(answer, nullptr, false);
              if (j.is_discarded() || !j.is_object() || !j.contains("ranks") || !j["ranks"].is_array()) {
                unreachable.push_back("a process's spans are not what stages answers: " + answer.substr(0, 200));
                continue;
              }
              for (const auto& r : j["ranks"]) ranks.push_back(r);
            }
            nlohmann::json out{{"trace", true},
                               {"file", file},
                               {"from_iteration", window->from},
                               {"to_iteration", hub.iteration()},
                               {"ranks", ranks}};
            return with_unreachable(out.dump() + "\n", unreachable);
          });
}

}  // namespace troupe
