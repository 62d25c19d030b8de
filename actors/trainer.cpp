#include "actors/trainer.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>

#include "actors/errors.hpp"
#include "engine/fault_injection.hpp"
#include "engine/loss_scaler.hpp"
#include "engine/lr_schedule.hpp"
#include "engine/moe_tally.hpp"
#include "engine/step_timers.hpp"
#include "engine/stragglers.hpp"

namespace troupe {

namespace {

using Clock = std::chrono::steady_clock;

struct TrainerState {
  TrainerSpec spec;
  int64_t iteration = 0;
  int64_t consumed = 0;
  bool running = false;
  bool stop_requested = false;  // stop after the current iteration
  bool stop_wanted = false;     // agree_on_stop: ask the other processes with the next step
  bool regrouping = false;      // the job agreed to stop for a node that asks to join
  bool finished = false;
  // Current iteration.
  Clock::time_point started;
  // Read-ahead of the next global batch.
  std::optional<Tensor> ahead;
  int64_t ahead_for = -1;      // consumed-samples index the read-ahead batch starts at
  bool ahead_in_flight = false;
  bool waiting_for_ahead = false;
  // Summary.
  double last_loss = 0;
  double last_eval_loss = -1;
  int64_t last_saved = -1;
  std::string last_checkpoint;
  // The inspector's controls (TrainerSpec::control).
  double step_lr = 0;        // the learning rate of the step in flight
  int64_t agreed = 0;        // the latest command number the last step agreed on
  bool paused = false;       // stop between iterations (pause; step N ran out)
  bool parked = false;       // stopped between iterations, waiting for a command
  bool applying = false;     // applying commands while parked (a save may take a while)
  int64_t steps_left = -1;   // step N: iterations left before pausing again; -1: not stepping
  int64_t capture_seq = 0;   // a tensor command wants this gradient from the next step (0: none)
  std::string capture_name;
  bool capture_activation = false;  // capture_name is an op (StepRequest::capture_activation)
  int capture_rank = -1, capture_micro = 0;
  // Mixed precision: the loss scaler (fp16's dynamic or static scale; bf16 and fp32: none), the scale
  // of the step in flight, and the steps (and their samples) overflows skipped.
  std::optional<LossScaler> scaler;
  double step_loss_scale = 1;
  int64_t skipped_steps = 0, skipped_samples = 0;
  // Every rank's compute sections, one step late (engine/stragglers.hpp); made at the first step
  // that carries them (a job of more than one rank).
  std::optional<StragglerTracker> stragglers;
};

using Self = trainer_actor::stateful_pointer<TrainerState>;

void start_iteration(Self self);
void finish(Self self);

// The loss scaler's part of a checkpoint's rng record (", ..." to append; empty without fp16):
// its state (LossScalerState::to_vector) and the steps and samples overflows skipped.
std::string loss_scaling_json(const TrainerState& st) {
  if (!st.scaler && st.skipped_steps == 0) return "";
  std::string out = ", \"skipped_steps\": " + std::to_string(st.skipped_steps) +
                    ", \"skipped_samples\": " + std::to_string(st.skipped_samples);
  if (st.scaler) {
    out += ", \"loss_scaler\": [";
    const std::vector<double> v = st.scaler->state().to_vector();
    for (size_t i = 0; i < v.size(); ++i) {
      char num[32];
      std::snprintf(num, sizeof num, "%.17g", v[i]);  // exact: the state round-trips
      out += (i ? ", " : "") + std::string(num);
    }
    out += "]";
  }
  return out;
}
void between_iterations(Self self);

void fail(Self self, const std::string& message) {
  auto& st = self->state;
  if (st.finished) return;
  st.finished = true;
  caf::anon_send(st.spec.listener, failed_atom::value, message);
  self->quit();
}

auto on_error(Self self) {
  return [self](caf::error& err) { fail(self, describe(err)); };
}

// The global batch of the iteration that begins after `consumed` samples (--rampup-batch-size
// ramps it up; otherwise --global-batch-size).
int64_t global_batch(Self self, int64_t consumed) { return self->state.spec.config.global_batch_at(consumed); }

void read_ahead(Self self) {
  auto& st = self->state;
  const int64_t next = st.consumed + global_batch(self, st.consumed);
  if (st.iteration + 1 >= st.spec.config.iterations_to_run() || st.ahead_in_flight || st.ahead_for == next) return;
  st.ahead_in_flight = true;
  st.ahead_for = next;
  st.ahead.reset();
  self->request(st.spec.loader, caf::infinite, batch_atom::value, DataSplit::train, next,
                static_cast<int32_t>(global_batch(self, next)))
      .then(
          [self](Tensor& batch) {
            auto& s = self->state;
            s.ahead_in_flight = false;
            s.ahead = std::move(batch);
            if (s.waiting_for_ahead) {
              s.waiting_for_ahead = false;
              start_iteration(self);
            }
          },
          on_error(self));
}

// `since`: when the save came due (a wait for the writer counts as the save's time). `memory`: an
// in-memory snapshot into spec.memory_dir instead of a save into --save.
void save_then(Self self, std::function<void()> next, bool memory = false,
               std::optional<Clock::time_point> since = std::nullopt) {
  auto& st = self->state;
  const auto t0 = since.value_or(Clock::now());
  const TrainConfig& cfg = st.spec.config;
  if (st.spec.saves_in_flight && st.spec.offload && st.spec.saves_in_flight->load() >= cfg.max_saves_in_flight) {
    // The writer is behind: wait until what it holds is on disk (a failed save fails the job here).
    st.spec.saves_in_flight->fetch_add(1);
    self->request(st.spec.offload, caf::infinite, flush_atom::value)
        .then(
            [self, next, memory, t0](ok_atom) {
              self->state.spec.saves_in_flight->fetch_sub(1);
              save_then(self, next, memory, t0);
            },
            [self](caf::error& err) {
              self->state.spec.saves_in_flight->fetch_sub(1);
              fail(self, describe(err));
            });
    return;
  }
  if (st.spec.control)
    st.spec.control->set_trainer_phase((memory ? "snapshotting iteration " : "saving iteration ") +
                                       std::to_string(st.iteration));
  SaveRequest req;
  req.dir = memory ? st.spec.memory_dir : cfg.save;
  req.memory = memory;
  req.iteration = st.iteration;
  req.consumed_samples = st.consumed;
  req.optimizer_step = st.iteration - st.spec.optimizer_step_offset - st.skipped_steps;
  req.config_json = cfg.to_json();
  req.rng_json = "{\"seed\": " + std::to_string(cfg.seed) + ", \"consumed_samples\": " + std::to_string(st.consumed) +
                 ", \"data_order\": \"splitmix64 Fisher-Yates permutation per epoch\"" + loss_scaling_json(st) + "}";
  auto saved_then = [self, next, t0](const SaveRequest& done) {
    auto& s = self->state;
    if (s.spec.finalize_save) {
      if (Status st = s.spec.finalize_save(done); !st) return fail(self, st.message());
    }
    SavedCheckpoint saved;
    saved.iteration = s.iteration;
    saved.path = done.dir;
    saved.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    saved.memory = done.memory;
    if (!done.memory) {
      s.last_saved = s.iteration;
      s.last_checkpoint = saved.path;
    }
    caf::anon_send(s.spec.listener, save_atom::value, saved);
    next();
  };
  self->request(st.spec.group, caf::infinite, save_atom::value, req)
      .then([saved_then, req](ok_atom) { saved_then(req); }, on_error(self));
}

// Mean loss over the first min(eval_iters * global batch, validation windows) validation windows, read
// one global batch at a time (so memory stays that of a training batch) and run in micro-batches.
struct EvalProgress {
  int64_t samples = 0;        // windows to evaluate
  int64_t next_sample = 0;    // first window of the next batch
  double loss_sum = 0;
  int64_t tokens = 0;
  int64_t terms = 0;  // loss terms (tokens, or the custom model's terms per sample)
  std::function<void()> next;  // continuation once done
  Clock::time_point started = Clock::now();
};

void finish_evaluation(Self self, const std::shared_ptr<EvalProgress>& ev) {
  EvalStats stats;
  stats.iteration = self->state.iteration;
  stats.loss = ev->loss_sum / static_cast<double>(ev->terms);
  stats.perplexity = std::exp(std::min(stats.loss, 700.0));
  stats.tokens = ev->tokens;
  stats.seconds = std::chrono::duration<double>(Clock::now() - ev->started).count();
  self->state.last_eval_loss = stats.loss;
  caf::anon_send(self->state.spec.listener, eval_atom::value, stats);
  ev->next();
}

void evaluate_batch(Self self, std::shared_ptr<EvalProgress> ev) {
  auto& st = self->state;
  if (ev->next_sample >= ev->samples) {
    finish_evaluation(self, ev);
    return;
  }
  const int64_t first = ev->next_sample;
  const int64_t count = std::min<int64_t>(st.spec.config.global_batch_size, ev->samples - first);
  ev->next_sample += count;
  self->request(st.spec.loader, caf::infinite, batch_atom::value, DataSplit::validation, first,
                static_cast<int32_t>(count))
      .then(
          [self, ev, count](Tensor& batch) {
            ev->tokens += count * (batch.dim(1) - 1);
            const int64_t per_sample = self->state.spec.loss_terms_per_sample;
            ev->terms += count * (per_sample > 0 ? per_sample : batch.dim(1) - 1);
            self->request(self->state.spec.group, caf::infinite, eval_atom::value, batch)
                .then(
                    [self, ev](double loss_sum) {
                      ev->loss_sum += loss_sum;
                      evaluate_batch(self, ev);
                    },
                    on_error(self));
          },
          on_error(self));
}

void evaluate_then(Self self, std::function<void()> next) {
  auto& st = self->state;
  const TrainConfig& cfg = st.spec.config;
  auto ev = std::make_shared<EvalProgress>();
  ev->samples = std::min<int64_t>(cfg.eval_iters * cfg.global_batch_size, st.spec.validation_windows);
  ev->next = std::move(next);
  if (st.spec.control) st.spec.control->set_trainer_phase("evaluating after iteration " + std::to_string(st.iteration));
  if (ev->samples <= 0) {
    ev->next();
    return;
  }
  evaluate_batch(self, ev);
}

void on_step(Self self, const GroupStepResult& r) {
  auto& st = self->state;
  const double grad_norm = r.grad_norm, loss_sum = r.loss_sum;
  const bool skipped = r.skipped;
  const double used_scale = st.step_loss_scale;
  if (st.scaler) {
    (void)st.scaler->update(skipped);
    if (st.scaler->exhausted()) {
      fail(self, "the loss scale reached --min-loss-scale (" + st.scaler->describe() +
                     ") and the gradients still overflow float16 -- the run diverged: lower --lr, or train with --bf16");
      return;
    }
  }
  const TrainConfig& cfg = st.spec.config;
  const double seconds = std::chrono::duration<double>(Clock::now() - st.started).count();
  const double lr = st.step_lr;
  st.iteration += 1;
  if (st.steps_left > 0 && --st.steps_left == 0) st.paused = true;
  const int64_t batch = global_batch(self, st.consumed);
  st.consumed += batch;
  IterationStats s = iteration_stats(cfg, st.iteration, st.consumed, loss_sum, grad_norm, lr, seconds,
                                     st.spec.loss_terms_per_sample, st.spec.gpt_flops, batch);
  s.busy_fraction_min = st.spec.report_busy ? r.busy_fraction_min : -1;
  s.busy_fraction_max = st.spec.report_busy ? r.busy_fraction_max : -1;
  s.params_norm = r.params_norm;
  s.num_zeros_in_grad = r.zeros_in_grad;
  s.moe = r.moe;
  s.moe_loss = moe_loss(cfg.model.moe, s.moe);
  s.loss_scale = used_scale;
  s.skipped = skipped;
  if (skipped) {
    st.skipped_steps += 1;
    st.skipped_samples += batch;
  }
  s.timers = combine_rank_timers(r.rank_timers, cfg.timing_log_level);
  if (!r.world_sections.empty()) {
    const int ranks = static_cast<int>(r.world_sections.size()) / kStragglerSections;
    if (!st.stragglers || st.stragglers->ranks() != ranks) {
      // Global ranks list pipeline stages slowest (comm/topology.hpp): stage = rank / (ranks / pp).
      const int per_stage = std::max(1, ranks / std::max(1, cfg.pipeline_model_parallel_size));
      std::vector<int> stage_of;
      for (int q = 0; q < ranks; ++q) stage_of.push_back(q / per_stage);
      st.stragglers.emplace(std::move(stage_of));
    }
    st.stragglers->add(r.world_sections);
    s.rank_scores = st.stragglers->scores();
    s.straggler_threshold = st.stragglers->threshold();
  }
  s.fraction_of_peak = st.spec.sgemm_peak_gflops > 0 ? s.model_tflops * 1e3 / st.spec.sgemm_peak_gflops : 0;
  st.last_loss = s.lm_loss;
  if (!std::isfinite(s.lm_loss)) {
    fail(self, "the training loss is not finite at iteration " + std::to_string(st.iteration) +
                   " -- the run diverged: lower --lr or raise --lr-warmup-iters");
    return;
  }
  caf::anon_send(st.spec.listener, progress_atom::value, s);
  auto after_eval = [self] {
    auto& s2 = self->state;
    const TrainConfig& c = s2.spec.config;
    if (!c.save.empty() && c.save_interval > 0 && s2.iteration % c.save_interval == 0)
      save_then(self, [self] { between_iterations(self); });
    else if (c.save_memory_interval > 0 && s2.iteration % c.save_memory_interval == 0 && !s2.spec.memory_dir.empty())
      save_then(self, [self] { between_iterations(self); }, /*memory=*/true);
    else
      between_iterations(self);
  };
  if (cfg.eval_interval > 0 && cfg.eval_iters > 0 && st.iteration % cfg.eval_interval == 0)
    evaluate_then(self, after_eval);
  else
    after_eval();
}

StepRequest step_request(Self self) {
  const auto& s = self->state;
  const TrainConfig& c = s.spec.config;
  // Steps an overflow skipped advance neither the schedule nor Adam's bias correction (Megatron
  // steps its scheduler only after a successful update; DeepSpeed likewise).
  StepRequest req = optimizer_step(c, s.iteration - s.skipped_steps, s.consumed - s.skipped_samples);
  req.step = s.iteration + 1;  // the dropout masks' key stays the iteration
  req.adam_step_offset = s.spec.optimizer_step_offset + s.skipped_steps;
  if (s.scaler) {
    req.loss_scale = s.scaler->scale();
    req.skip_on_overflow = true;
  }
  req.stop = s.stop_wanted;
  if (s.spec.regroup != nullptr && s.spec.regroup->load()) {
    // With in-memory snapshots the job stops at the next one (nothing trained is lost, no extra
    // snapshot); otherwise now, saving with --save.
    // With neither there is nothing to resume from, and the run goes on (job.cpp notes it).
    const int64_t every = s.spec.memory_dir.empty() ? 0 : c.save_memory_interval;
    req.regroup = every > 0 ? req.step % every == 0 : !c.save.empty();
  }
  if (s.spec.control) {
    req.control = s.spec.control->vote();
    if (const auto lr = s.spec.control->state().lr_override) req.lr = *lr;
    if (s.capture_seq > 0 && !s.capture_activation) req.capture_grad = s.capture_name;
    if (s.capture_seq > 0 && s.capture_activation) {
      req.capture_activation = s.capture_name;
      req.capture_rank = s.capture_rank;
      req.capture_micro = s.capture_micro;
    }
  }
  return req;
}

// The inspector's commands, one after the other (a save completes before the next command).
void apply_commands(Self self, std::shared_ptr<std::vector<ControlCommand>> commands, size_t i,
                    std::function<void()> done) {
  auto& st = self->state;
  if (i == commands->size() || st.finished) return done();
  const ControlCommand& c = (*commands)[i];
  auto next = [self, commands, i, done, seq = c.seq] {
    self->state.spec.control->applied(seq, self->state.iteration);
    apply_commands(self, commands, i + 1, done);
  };
  // What the inspector answers is read once the command is applied (next() below), so the state a
  // command changes is published first: a resumed job is not "paused" in its answer.
  if (c.verb == "pause") {
    st.paused = true;
    st.steps_left = -1;
  } else if (c.verb == "resume") {
    st.paused = false;
    st.steps_left = -1;
    st.spec.control->set_paused(false, st.iteration);
  } else if (c.verb == "step") {
    st.paused = false;
    st.steps_left = std::stoll(c.args.at(0));
    st.spec.control->set_paused(false, st.iteration);
  } else if (c.verb == "stop") {  // as SIGINT: save (with --save) after this iteration, then end
    st.paused = false;
    st.steps_left = -1;
    st.stop_requested = true;  // every process applies it after the same iteration: no vote needed
    st.spec.control->set_paused(false, st.iteration);
  } else if (c.verb == "set" && c.args.at(0) == "lr") {
    st.spec.control->set_lr_override(c.args.at(1) == "schedule" ? std::optional<double>() : std::stod(c.args.at(1)));
  } else if (c.verb == "set" && c.args.at(0) == "log-interval") {
    st.spec.control->set_log_interval(std::stoll(c.args.at(1)));
  } else if (c.verb == "tensor" && (c.args.at(1) == "grad" || c.args.at(1) == "activation")) {  // the next step's
    st.capture_seq = c.seq;
    st.capture_name = c.args.at(0);
    st.capture_activation = c.args.at(1) == "activation";
    if (st.capture_activation) {
      st.capture_rank = std::stoi(c.args.at(2));
      st.capture_micro = std::stoi(c.args.at(3));
    }
  } else if (c.verb == "tensor") {
    const int32_t kind = static_cast<int32_t>(c.args.at(1) == "value"     ? TensorKind::value
                                              : c.args.at(1) == "exp_avg" ? TensorKind::exp_avg
                                                                          : TensorKind::exp_avg_sq);
    const int64_t seq = c.seq, iteration = st.iteration;
    self->request(st.spec.group, caf::infinite, tensor_atom::value, c.args.at(0), kind)
        .then(
            [self, next, seq, iteration](std::vector<RankPieces>& parts) {
              self->state.spec.control->put_pieces(seq, JobControl::Pieces{iteration, std::move(parts)});
              next();
            },
            [self, next, seq](caf::error& err) {
              self->state.spec.control->put_pieces(seq, Status::error(describe(err)));
              next();
            });
    return;
  } else if (c.verb == "save" && st.last_saved != st.iteration) {
    save_then(self, next);
    return;
  }
  next();
}

// Parked between iterations: applies what arrived, and goes on once no longer paused.
void unpark(Self self) {
  auto& st = self->state;
  if (!st.parked || st.applying || st.finished) return;
  if (st.stop_requested || st.stop_wanted) {  // a stop that came while applying commands
    st.parked = false;
    st.spec.control->set_paused(false, st.iteration);
    return finish(self);
  }
  auto commands = std::make_shared<std::vector<ControlCommand>>(st.spec.control->take_all());
  if (commands->empty()) return;
  st.applying = true;
  apply_commands(self, commands, 0, [self] {
    auto& s = self->state;
    s.applying = false;
    if (s.paused) return unpark(self);  // more may have arrived meanwhile
    s.parked = false;
    s.spec.control->set_paused(false, s.iteration);
    start_iteration(self);
  });
}

// After an iteration (its evaluation and save included): the commands the step agreed on, then the
// next iteration, or a pause.
void between_iterations(Self self) {
  auto& st = self->state;
  if (!st.spec.control) return start_iteration(self);
  auto commands = std::make_shared<std::vector<ControlCommand>>(st.spec.control->take_through(st.agreed));
  apply_commands(self, commands, 0, [self] {
    auto& s = self->state;
    if (s.paused && s.iteration < s.spec.config.iterations_to_run() && !s.stop_requested) {
      s.parked = true;
      s.spec.control->set_paused(true, s.iteration);
      s.spec.control->set_trainer_phase("paused after iteration " + std::to_string(s.iteration));
      return unpark(self);  // commands that arrived before it stopped
    }
    start_iteration(self);
  });
}

void run_micro_batches(Self self, const Tensor& batch) {
  auto& st = self->state;
  const TrainConfig& cfg = st.spec.config;
  const int64_t per_sample = st.spec.loss_terms_per_sample > 0 ? st.spec.loss_terms_per_sample : cfg.model.seq_length;
  // The mean over this iteration's samples (fewer than --global-batch-size during a ramp-up).
  const double scale = 1.0 / (static_cast<double>(batch.dim(0)) * static_cast<double>(per_sample));
  const StepRequest req = step_request(self);
  st.step_lr = req.lr;
  st.step_loss_scale = req.loss_scale;
  self->request(st.spec.group, caf::infinite, train_step_atom::value, batch, scale * req.loss_scale, req)
      .then(
          [self](const GroupStepResult& r) {
            if (r.stop) self->state.stop_requested = true;  // every process stops after this step
            if (r.regroup) self->state.regrouping = true;
            self->state.agreed = r.control;
            if (auto& s = self->state; s.capture_seq > 0) {  // the gradient a tensor command asked for
              s.spec.control->put_pieces(s.capture_seq, JobControl::Pieces{s.iteration + 1, r.captured});
              s.capture_seq = 0;
            }
            on_step(self, r);
          },
          on_error(self));
  read_ahead(self);  // overlaps the next batch's reading with this iteration's compute
}

void request_stop(Self self) {
  auto& st = self->state;
  if (st.spec.agree_on_stop)
    st.stop_wanted = true;
  else
    st.stop_requested = true;
}

void start_iteration(Self self) {
  auto& st = self->state;
  if (st.finished) return;
  if (st.spec.exit_deadline && Clock::now() >= *st.spec.exit_deadline) request_stop(self);
  const int64_t exit_interval = st.spec.config.exit_interval;
  const bool exit_now = exit_interval > 0 && st.iteration > st.spec.start_iteration && st.iteration % exit_interval == 0;
  if (st.iteration >= st.spec.config.iterations_to_run() || st.stop_requested || exit_now) {
    finish(self);
    return;
  }
  st.started = Clock::now();
  if (st.spec.control) {
    st.spec.control->set_trainer_phase("iteration " + std::to_string(st.iteration + 1));
    st.spec.control->set_trainer_mailbox(static_cast<int64_t>(self->mailbox().size()));
  }
  throw_if_asked("trainer", -1, st.iteration + 1);
  if (st.ahead && st.ahead_for == st.consumed) {
    Tensor batch = std::move(*st.ahead);
    st.ahead.reset();
    run_micro_batches(self, batch);
    return;
  }
  if (st.ahead_in_flight && st.ahead_for == st.consumed) {
    st.waiting_for_ahead = true;
    return;
  }
  self->request(st.spec.loader, caf::infinite, batch_atom::value, DataSplit::train, st.consumed,
                static_cast<int32_t>(global_batch(self, st.consumed)))
      .then([self](Tensor& batch) { run_micro_batches(self, batch); }, on_error(self));
}

void finish(Self self) {
  auto& st = self->state;
  if (st.spec.control) st.spec.control->set_trainer_phase("finishing");
  auto done = [self] {
    auto& s = self->state;
    if (s.finished) return;
    s.finished = true;
    TrainSummary sum;
    sum.iteration = s.iteration;
    sum.last_loss = s.last_loss;
    sum.last_eval_loss = s.last_eval_loss;
    sum.stopped_early = s.iteration < s.spec.config.iterations_to_run();
    sum.regrouped = s.regrouping && sum.stopped_early;
    sum.last_checkpoint = s.last_checkpoint;
    caf::anon_send(s.spec.listener, done_atom::value, sum);
    self->quit();
  };
  if (!st.spec.config.save.empty() && st.last_saved != st.iteration && st.iteration > st.spec.start_iteration)
    save_then(self, done);
  else
    done();
}

trainer_actor::behavior_type trainer_behavior(Self self, TrainerSpec spec) {
  name_exceptions(self, "the trainer");
  self->state.spec = std::move(spec);
  self->state.iteration = self->state.spec.start_iteration;
  self->state.consumed = self->state.spec.consumed_samples;
  self->state.skipped_steps = self->state.spec.skipped_steps;
  self->state.skipped_samples = self->state.spec.skipped_samples;
  if (const PrecisionConfig& p = self->state.spec.config.precision; p.dtype == PrecisionDType::fp16) {
    self->state.scaler.emplace(p);
    if (self->state.spec.loss_scaler_state) self->state.scaler->restore(*self->state.spec.loss_scaler_state);
  }
  self->monitor(self->state.spec.group);
  self->monitor(self->state.spec.loader);
  self->set_down_handler([self](caf::down_msg& msg) {
    fail(self, "a worker actor stopped unexpectedly (" + describe(msg.reason) + ")");
  });
  return {
      [self](run_atom) {
        if (self->state.running) return;
        self->state.running = true;
        start_iteration(self);
      },
      [self](stop_atom) {
        request_stop(self);
        auto& st = self->state;
        if (st.parked && !st.applying) {  // paused: no step carries the wish, every process stops here
          st.parked = false;
          st.spec.control->set_paused(false, st.iteration);
          finish(self);
        }
      },
      [self](control_atom) { unpark(self); },
  };
}

}  // namespace

trainer_actor spawn_trainer(caf::actor_system& system, const TrainerSpec& spec) {
  return system.spawn(trainer_behavior, spec);
}

}  // namespace troupe
