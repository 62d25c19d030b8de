// The job's controls from the inspector (troupe inspect: pause, step N, resume, set lr X, set
// log-interval N, save; docs/INSPECT.md): a queue of numbered commands between the inspector's
// server thread and the trainer.
//
// Every process of a job must apply a command after the same iteration (a learning rate that
// changed in one data-parallel replica and not in another would split the model). So:
//   1. rank 0's inspector numbers the command (next_seq) and hands it to every other process's
//      inspector (they deliver() it) before delivering it to its own trainer;
//   2. rank 0's trainer puts the highest number it holds on its next step (StepRequest::control);
//      the step's all-reduce over the world tells every process that number (StepOutcome::control);
//   3. after that step every trainer applies its commands up to that number, in order.
// While the job is paused no step runs: every process stopped after the same iteration, and applies a
// command as soon as it arrives (resume, step N, save, set ...), so they still agree.
//
// Thread-safe: the inspector's thread delivers and waits, the trainer's takes and publishes.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <atomic>
#include <map>
#include <memory>

#include "inspect/control_command.hpp"
#include "engine/types.hpp"
#include "troupe/status.hpp"

namespace troupe {

class InspectHub;
struct TrainConfig;

class JobControl {
 public:
  // Rank 0's process: the number of a new command.
  int64_t next_seq();
  // A command for this process's trainer (numbered by rank 0), then wakes the trainer.
  void deliver(ControlCommand command);
  // The trainer: how it is woken when a command arrives (set once, before training starts).
  void set_wake(std::function<void()> wake);
  // The highest number delivered here (rank 0's trainer puts it on each step).
  int64_t vote() const;
  // The commands numbered up to `seq` (agreed in a step), or all of them (while paused), in order.
  std::vector<ControlCommand> take_through(int64_t seq);
  std::vector<ControlCommand> take_all();

  // What the trainer publishes: the commands it applied, whether it is paused (after which iteration).
  void applied(int64_t seq, int64_t iteration);
  void set_paused(bool paused, int64_t iteration);
  bool paused() const;
  // The inspector waits (bounded) for a command to be applied; false on timeout.
  bool wait_applied(int64_t seq, std::chrono::milliseconds timeout) const;
  // The inspector waits (bounded) until the trainer is paused; false on timeout.
  bool wait_paused(std::chrono::milliseconds timeout) const;
  // The inspector waits (bounded) until the trainer paused after `iteration` or later, or is
  // finishing (the run ended first); false on timeout.
  bool wait_paused_after(int64_t iteration, std::chrono::milliseconds timeout) const;
  struct State {
    bool paused = false;
    int64_t paused_after = -1;  // the iteration it stopped after
    int64_t applied_seq = 0;
    int64_t last_applied_iteration = -1;
    std::string last_applied;  // the text of the last command applied
    std::optional<double> lr_override;
    std::optional<int64_t> log_interval;
    std::string trainer = "starting";  // what the trainer does: "iteration 12", "evaluating", "saving"...
    int saves_in_flight = 0;           // checkpoints the offload actor is still writing
    int64_t offload_mailbox = -1;      // messages waiting in the offload actor's mailbox; -1: unknown
    int64_t trainer_mailbox = -1;      // in the trainer's, at the start of its current iteration
  };
  State state() const;
  void set_trainer_phase(std::string phase);
  void set_trainer_mailbox(int64_t messages);
  // The offload actor's count of saves in flight (TrainerSpec::saves_in_flight) and its mailbox
  // depth, for state().
  void watch_offload(std::shared_ptr<const std::atomic<int>> saves_in_flight,
                     std::shared_ptr<const std::atomic<int64_t>> mailbox);
  void set_lr_override(std::optional<double> lr);
  void set_log_interval(int64_t n);

  // What a tensor command read on this process's ranks (by its number), until the inspector takes
  // it: the trainer puts, the inspector waits (bounded) and takes. At most a few are kept.
  struct Pieces {
    int64_t iteration = 0;  // the values after this many iterations (grad: of this iteration)
    std::vector<RankPieces> parts;
  };
  void put_pieces(int64_t seq, Result<Pieces> pieces);
  Result<Pieces> take_pieces(int64_t seq, std::chrono::milliseconds timeout);

  // The parameters' global names (for `tensor` and completion), set once the ranks are up.
  void set_tensor_names(std::vector<std::string> names);
  std::vector<std::string> tensor_names() const;

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable changed_;
  std::deque<ControlCommand> pending_;
  int64_t last_seq_ = 0, delivered_ = 0;
  std::function<void()> wake_;
  State state_;
  std::map<int64_t, Result<Pieces>> pieces_;
  std::vector<std::string> names_;
  std::shared_ptr<const std::atomic<int>> saves_in_flight_;
  std::shared_ptr<const std::atomic<int64_t>> offload_mailbox_;
};

// The control commands on the job's inspector: pause, resume, step [N], set lr X|schedule, set
// log-interval N, save. In rank 0's process a command is numbered and handed to every process;
// the answer comes once this process applied it (or says it is still pending).
void add_control_commands(InspectHub& hub, JobControl& control, const TrainConfig& config);

}  // namespace troupe
