// troupe::spawn_training (include/troupe/actors.hpp): the job's rank actors in the caller's actor
// system, behind one actor that takes batches as messages. The ranks, their group and optimizer
// partitions are the ones `troupe train` runs (actors/rank_actor.hpp); this actor stands where the
// trainer and the data loader would, with the caller's actors as the source of batches.
#include "troupe/actors.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <thread>

#include "actors/errors.hpp"
#include "actors/job.hpp"
#include "actors/rank_actor.hpp"
#include "api/setup.hpp"
#include "config/run_identity.hpp"
#include "engine/loss_scaler.hpp"
#include "engine/lr_schedule.hpp"
#include "engine/moe_tally.hpp"
#include "storage/checkpoint.hpp"
#include "storage/host_pool.hpp"
#include "storage/sharded_checkpoint.hpp"

namespace troupe {

namespace {

struct TrainingActorState {
  TrainConfig cfg;
  ModelReport report;  // a model given in code: its loss terms per sample, whether GPT's FLOPs apply
  RankSet local;
  ParallelConfig par;
  int64_t iteration = 0, consumed = 0;
  // fp16's loss scaling (as the trainer's, actors/trainer.cpp): skipped steps advance neither the
  // schedule nor Adam's step count.
  std::optional<LossScaler> scaler;
  int64_t skipped_steps = 0, skipped_samples = 0;
};

using Self = training_actor::stateful_pointer<TrainingActorState>;

caf::error bad_batch(const std::string& what) { return make_actor_error(ActorErrc::bad_input, what); }

// The batch as (sequences, seq_length + 1) i32 windows, or the problem with it.
Result<Tensor> windows_of(const TokenBatch& b, const TrainConfig& cfg) {
  const int64_t row = int64_t{cfg.model.seq_length} + 1;
  if (b.sequences < 1 || static_cast<int64_t>(b.tokens.size()) != b.sequences * row)
    return Status::bad_input("a TokenBatch of " + std::to_string(b.sequences) + " sequences holds " +
                             std::to_string(b.tokens.size()) + " tokens, not sequences x (seq_length + 1) = " +
                             std::to_string(std::max<int64_t>(b.sequences, 0) * row) +
                             " -- give every window seq_length + 1 tokens");
  const auto bad = std::find_if(b.tokens.begin(), b.tokens.end(),
                                [&](int32_t t) { return t < 0 || t >= cfg.model.vocab_size; });
  if (bad != b.tokens.end())
    return Status::bad_input("token " + std::to_string(*bad) + " at position " +
                             std::to_string(bad - b.tokens.begin()) + " is outside the vocabulary [0, " +
                             std::to_string(cfg.model.vocab_size) + ") -- tokenize with the config's tokenizer");
  Tensor t = Tensor::empty({b.sequences, row}, DType::i32);
  std::memcpy(t.raw(), b.tokens.data(), b.tokens.size() * sizeof(int32_t));
  return t;
}

// The loss terms of one window: the model's (a model given in code), or a loss per token.
int64_t terms_per_window(const TrainingActorState& s) {
  return s.report.loss_terms_per_sample > 0 ? s.report.loss_terms_per_sample : s.cfg.model.seq_length;
}

training_actor::behavior_type training_behavior(Self self, TrainConfig cfg, ModelReport report, RankSet local,
                                                ParallelConfig par, int64_t iteration, int64_t consumed) {
  auto& st = self->state;
  st.cfg = std::move(cfg);
  st.report = report;
  st.local = std::move(local);
  st.par = std::move(par);
  st.iteration = iteration;
  st.consumed = consumed;
  if (st.cfg.precision.dtype == PrecisionDType::fp16) st.scaler.emplace(st.cfg.precision);
  // The ranks go with this actor; a rank that dies (the group quits) takes this actor with it.
  self->link_to(st.local.group);
  self->attach_functor([group = st.local.group, ranks = st.local.ranks](const caf::error&) {
    caf::anon_send_exit(group, caf::exit_reason::user_shutdown);
    for (const auto& r : ranks) caf::anon_send_exit(r, caf::exit_reason::user_shutdown);
  });
  return {
      [self](train_batch_atom, const TokenBatch& batch) -> caf::result<IterationStats> {
        auto& s = self->state;
        const TrainConfig& c = s.cfg;
        if (batch.sequences != c.global_batch_size)
          return bad_batch("a training batch holds global_batch_size = " + std::to_string(c.global_batch_size) +
                           " windows, not " + std::to_string(batch.sequences) + " -- send whole global batches");
        auto windows = windows_of(batch, c);
        if (!windows) return bad_batch(windows.status().message());
        const double scale = 1.0 / (static_cast<double>(c.global_batch_size) * static_cast<double>(terms_per_window(s)));
        StepRequest req = optimizer_step(c, s.iteration - s.skipped_steps, s.consumed - s.skipped_samples);
        req.step = s.iteration + 1;
        req.adam_step_offset = s.skipped_steps;
        if (s.scaler) {
          req.loss_scale = s.scaler->scale();
          req.skip_on_overflow = true;
        }
        auto rp = self->make_response_promise<IterationStats>();
        const auto t0 = std::chrono::steady_clock::now();
        self->request(s.local.group, caf::infinite, train_step_atom::value, windows.value(), scale * req.loss_scale, req)
            .then(
                [self, rp, req, t0](const GroupStepResult& r) mutable {
                  auto& s = self->state;
                  if (s.scaler) (void)s.scaler->update(r.skipped);
                  if (r.skipped) {
                    s.skipped_steps += 1;
                    s.skipped_samples += s.cfg.global_batch_size;
                  }
                  s.iteration += 1;
                  s.consumed += s.cfg.global_batch_size;
                  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
                  IterationStats out = iteration_stats(s.cfg, s.iteration, s.consumed, r.loss_sum, r.grad_norm, req.lr,
                                                       seconds, s.report.loss_terms_per_sample, s.report.gpt_flops);
                  // As the trainer fails the job: a non-finite loss ends training (the ranks already
                  // refuse a non-finite gradient norm).
                  if (!std::isfinite(out.lm_loss)) {
                    rp.deliver(make_actor_error(ActorErrc::diverged,
                                                "the training loss is not finite at iteration " +
                                                    std::to_string(s.iteration) +
                                                    " -- the run diverged: lower the learning rate or warm up longer"));
                    return;
                  }
                  out.loss_scale = req.loss_scale;
                  out.skipped = r.skipped;
                  out.busy_fraction_min = r.busy_fraction_min;
                  out.busy_fraction_max = r.busy_fraction_max;
                  out.moe = r.moe;
                  out.moe_loss = moe_loss(s.cfg.model.moe, out.moe);
                  rp.deliver(out);
                },
                [rp](caf::error& err) mutable { rp.deliver(std::move(err)); });
        return rp;
      },
      [self](eval_batch_atom, const TokenBatch& batch) -> caf::result<EvalStats> {
        auto& s = self->state;
        auto windows = windows_of(batch, s.cfg);
        if (!windows) return bad_batch(windows.status().message());
        auto rp = self->make_response_promise<EvalStats>();
        const int64_t tokens = batch.sequences * terms_per_window(s);  // loss terms (tokens for GPT's head)
        self->request(s.local.group, caf::infinite, eval_atom::value, windows.value())
            .then(
                [self, rp, tokens](double loss_sum) mutable {
                  EvalStats e;
                  e.iteration = self->state.iteration;
                  e.tokens = tokens;
                  e.loss = loss_sum / static_cast<double>(tokens);
                  e.perplexity = std::exp(std::min(e.loss, 700.0));
                  rp.deliver(e);
                },
                [rp](caf::error& err) mutable { rp.deliver(std::move(err)); });
        return rp;
      },
      [self](save_to_atom, const std::string& dir) -> caf::result<SavedCheckpoint> {
        auto& s = self->state;
        SaveRequest req;
        req.dir = dir;
        req.iteration = s.iteration;
        req.consumed_samples = s.consumed;
        req.optimizer_step = s.iteration - s.skipped_steps;
        TrainConfig saved = s.cfg;
        saved.save = dir;
        req.config_json = saved.to_json();
        req.rng_json = "{\"seed\": " + std::to_string(s.cfg.seed) + ", \"consumed_samples\": " +
                       std::to_string(s.consumed) + ", \"data_order\": \"the caller's batches\"}";
        auto rp = self->make_response_promise<SavedCheckpoint>();
        const auto t0 = std::chrono::steady_clock::now();
        self->request(s.local.group, caf::infinite, save_atom::value, req)
            .then(
                [self, rp, req, t0](ok_atom) mutable {
                  auto& s = self->state;
                  const Status done = commit_sharded_checkpoint(req.dir, checkpoint_meta(req, run_json(s.cfg.run_id)),
                                                                s.par.to_json(),
                                                                shard_file_names(s.par.world_size()));
                  if (!done) {
                    rp.deliver(to_caf_error(done));
                    return;
                  }
                  SavedCheckpoint out;
                  out.iteration = req.iteration;
                  out.path = req.dir;
                  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
                  out.committed = true;
                  rp.deliver(out);
                },
                [rp](caf::error& err) mutable { rp.deliver(std::move(err)); });
        return rp;
      },
      [self](state_atom) -> TrainingState {
        const auto& s = self->state;
        TrainingState out;
        out.iteration = s.iteration;
        out.consumed_samples = s.consumed;
        out.next_lr = learning_rate(s.cfg, s.iteration);
        out.world_size = s.par.world_size();
        out.layout = s.local.topology->describe();
        return out;
      },
  };
}

}  // namespace

Result<training_actor> spawn_training(caf::actor_system& system, const TrainConfig& config,
                                      const TrainingOptions& options) {
  TrainConfig cfg = config;
  // The batches come as messages: the config names no data.
  TROUPE_RETURN_IF_ERROR(resolve_config(cfg, 1, 1, GivenToRun{/*data=*/true, options.model.get()}));
  if (cfg.run_id.empty()) cfg.run_id = new_run_id();
  JobOptions job;
  job.model = options.model;
  job.schedule = options.schedule;
  const int threads = cfg.num_threads > 0 ? cfg.num_threads : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  auto planned = plan_ranks(cfg, job, threads);
  if (!planned) return planned.status();
  RankSpec spec = std::move(planned).value();
  OptimizerOffload offload;
  offload.device = cfg.offload_optimizer;
  offload.path = cfg.offload_path;
  offload.pool = std::make_shared<HostPool>();
  auto local = spawn_ranks(system, spec, nullptr, {}, offload);
  if (!local) return local.status();
  // The model: from the seed, or config.load's latest checkpoint (any layout, optimizer included).
  caf::scoped_actor self{system};
  int64_t iteration = 0, consumed = 0;
  Status ready;
  if (cfg.load.empty()) {
    self->request(local->group, caf::infinite, init_atom::value, cfg.seed)
        .receive([](ok_atom) {}, [&](caf::error& err) { ready = to_status(err); });
  } else {
    auto checkpoint = Checkpoint::open_latest(cfg.load);
    if (!checkpoint) {
      ready = checkpoint.status().as_bad_input();
    } else {
      LoadRequest req;
      req.dir = cfg.load;
      req.iteration = checkpoint->iteration();
      req.load_optimizer = true;
      iteration = checkpoint->meta().iteration;
      consumed = checkpoint->meta().consumed_samples;
      self->request(local->group, caf::infinite, load_atom::value, req)
          .receive([](ok_atom) {}, [&](caf::error& err) { ready = to_status(err); });
    }
  }
  if (!ready) {
    local->exit(self.ptr());
    return ready;
  }
  return system.spawn(training_behavior, cfg, model_report(options.model.get()), local.value(), spec.par, iteration,
                      consumed);
}

}  // namespace troupe
