#include "actors/rank_actor.hpp"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "actors/errors.hpp"
#include "kernels/device_memory.hpp"
#include "engine/fault_injection.hpp"
#include "actors/optimizer_actor.hpp"
#include "storage/sharded_checkpoint.hpp"
#include "storage/shard_file.hpp"

namespace troupe {

namespace {

struct RankState {
  std::shared_ptr<comm::CommWorld> world;
  std::unique_ptr<comm::Communicator> tp, pp, dp, embedding, everyone;
  std::unique_ptr<comm::Communicator> ep, expert_dp;  // expert parallelism (ep > 1) only
  std::unique_ptr<comm::Communicator> cp;             // context parallelism (cp > 1) only
  // GPU ranks: the pipeline's links, one communicator per (direction, sending stage) this stage is
  // an end of (RankComms::pp_link).
  std::map<std::pair<int, int>, std::unique_ptr<comm::Communicator>> links;
  std::unique_ptr<RankEngine> engine;
  optimizer_actor optimizer;  // this rank's ZeRO optimizer partition, linked
  offload_actor offload;      // background checkpoint writer of the process (may be null)
  std::shared_ptr<BufferRecycler> snapshot_buffers;  // the rank's in-memory snapshots' buffers and files (or null)
  Status created;  // creating the groups: an error is every command's reply
  int rank = 0;
  int world_size = 1;
  std::string layout_json;  // ParallelConfig::to_json: which snapshot lists of shards hold for it
};

caf::error rank_error(int rank, const Status& st) {
  return to_caf_error(st.with_context("rank " + std::to_string(rank) + ": "));
}

// flight: where the groups' operations are recorded (groups of one rank are not: they never wait
// on anybody); null: nowhere.
// links_apart: every pipeline link and direction gets a communicator of its own (RankComms::pp_link;
// GPU ranks, whose NCCL groups match messages in issue order on one stream each).
Status make_groups(RankState& st, const comm::Topology& topo, int rank,
                   const std::shared_ptr<comm::FlightRecorder>& flight, bool links_apart, int ep) {
  auto group = [&](const char* name, const std::vector<int>& members,
                   std::unique_ptr<comm::Communicator>& out) -> Status {
    auto g = st.world->group(members);
    if (!g) return g.status();
    out = std::move(g).value();
    if (flight && members.size() > 1) out = comm::record_flight(std::move(out), flight, name, members);
    return Status::ok();
  };
  // The same order on every rank: creating a group is collective among its members.
  TROUPE_RETURN_IF_ERROR(group("tp", topo.tp_group(rank), st.tp));
  // The gradients' group: dp, or dp x cp under context parallelism (RankComms::dp).
  const bool cp = topo.sizes().cp > 1;
  TROUPE_RETURN_IF_ERROR(group(cp ? "dp x cp" : "dp", topo.dp_cp_group(rank), st.dp));
  TROUPE_RETURN_IF_ERROR(group("pp", topo.pp_group(rank), st.pp));
  if (cp) TROUPE_RETURN_IF_ERROR(group("cp", topo.cp_group(rank), st.cp));
  if (ep > 1) {
    TROUPE_RETURN_IF_ERROR(group("ep", topo.expert_parallel_group(rank, ep), st.ep));
    TROUPE_RETURN_IF_ERROR(group("expert dp", topo.expert_data_parallel_group(rank, ep), st.expert_dp));
  }
  // The links in one order on every rank (direction, then sending stage), each made by its two ends.
  const std::vector<int> stages = topo.pp_group(rank);
  const int p = static_cast<int>(stages.size());
  if (links_apart && p > 1)
    for (int dir = 0; dir < 2; ++dir)
      for (int s = 0; s < p; ++s) {
        const int r = pipe_link_receiver(dir, s, p);
        if (rank != stages[static_cast<size_t>(s)] && rank != stages[static_cast<size_t>(r)]) continue;
        std::vector<int> ends = {stages[static_cast<size_t>(s)], stages[static_cast<size_t>(r)]};
        std::sort(ends.begin(), ends.end());
        TROUPE_RETURN_IF_ERROR(group(dir == 0 ? "pp activations" : "pp gradients", ends, st.links[{dir, s}]));
      }
  // Only the first and last stages are in an embedding group (pp > 1); the middle stages have none.
  if (const auto members = topo.embedding_group(rank); !members.empty())
    TROUPE_RETURN_IF_ERROR(group("embedding", members, st.embedding));
  std::vector<int> everyone(static_cast<size_t>(st.world->size()));
  for (int r = 0; r < st.world->size(); ++r) everyone[static_cast<size_t>(r)] = r;
  return group("world", everyone, st.everyone);
}

rank_actor::behavior_type rank_behavior(rank_actor::stateful_pointer<RankState> self, RankSpec spec,
                                        comm::Topology topo, int rank, std::shared_ptr<comm::CommWorld> world,
                                        offload_actor offload, OptimizerOffload optimizer_offload,
                                        std::shared_ptr<ActivityBoard> board,
                                        std::shared_ptr<comm::FlightRecorder> flight) {
  configure_blas_threads();
  name_exceptions(self, "rank " + std::to_string(rank));
  auto& st = self->state;
  st.rank = rank;
  st.world_size = spec.par.world_size();
  st.layout_json = spec.par.to_json();
  st.world = std::move(world);
  st.offload = std::move(offload);
  st.created = make_groups(st, topo, rank, flight, spec.device == Device::cuda, spec.par.ep);
  if (st.created) {
    RankComms comms;
    comms.tp = st.tp.get();
    comms.pp = st.pp.get();
    comms.dp = st.dp.get();
    comms.embedding = st.embedding.get();
    comms.world = st.everyone.get();
    comms.ep = st.ep.get();
    comms.expert_dp = st.expert_dp.get();
    comms.cp = st.cp.get();
    if (!st.links.empty()) {
      const std::vector<int> stages = topo.pp_group(rank);
      const int me = topo.coords(rank).pp;
      comms.pp_link = [links = &st.links, stages, me](int dir, int peer, bool sending) {
        comm::Communicator* c = links->at({dir, sending ? me : peer}).get();
        // A link's ranks are its two ends by ascending global rank.
        return PipeLink{c, stages[static_cast<size_t>(peer)] < stages[static_cast<size_t>(me)] ? 0 : 1};
      };
    }
    // The rank's mailbox depth on the inspector's board: this thread runs the actor's handlers and,
    // within them, the engine's changes of state, so it alone reads the mailbox.
    if (board) board->set_mailbox_probe([self] { return self->mailbox().size(); });
    if (spec.recycle_snapshots) {
      // Each rank its own recycler (engine/buffer_recycler.hpp): a shard's pieces must come back to
      // that shard's kept file. Its parameters' copies (the engine) and its moments' (the optimizer).
      spec.snapshot_buffers = std::make_shared<BufferRecycler>();
      optimizer_offload.snapshot_buffers = spec.snapshot_buffers;
      st.snapshot_buffers = spec.snapshot_buffers;
    }
    try {
      st.engine = std::make_unique<RankEngine>(spec, topo, rank, comms, std::move(board));
    } catch (const DeviceError& e) {  // its GPU cannot be used, or the model does not fit in it
      st.created = Status::error(e.what());
    }
    if (st.engine && spec.coverage) spec.coverage->set(st.engine->shard_coverage());
    optimizer_offload.rank = rank;
    if (st.engine && !spec.evaluation_only) {
      auto optimizer = spawn_optimizer(self->system(), st.engine->adam_segments(), spec.num_threads, optimizer_offload,
                                       spec.device == Device::cuda ? spec.cuda_device : -1);
      if (optimizer) {
        st.optimizer = std::move(optimizer).value();
        self->link_to(st.optimizer);  // one fails, both go: the group sees the rank die
      } else {
        st.created = optimizer.status();
      }
    }
  }
  // Training commands need the optimizer partition, which a rank that only evaluates has not.
  auto trains = [self]() -> Status {
    if (self->state.optimizer) return Status::ok();
    return Status::error("this rank only evaluates (RankSpec::evaluation_only): it cannot train, save or load "
                         "optimizer state");
  };
  return {
      [self](init_atom, uint64_t seed) -> caf::result<ok_atom> {
        auto& s = self->state;
        if (!s.created) return rank_error(s.rank, s.created);
        s.engine->init(seed);
        return ok_atom::value;
      },
      [self, trains](train_step_atom, const RankStepRequest& req) -> caf::result<StepOutcome> {
        auto& s = self->state;
        if (!s.created) return rank_error(s.rank, s.created);
        if (Status st = trains(); !st) return rank_error(s.rank, st);
        throw_if_asked("rank", s.rank, req.step.step);
        hang_if_asked("rank", s.rank, req.step.step);
        auto out = s.engine->compute_gradients(req.tokens, req.grad_scale, req.step);
        if (!out) return rank_error(s.rank, out.status());
        if (out.value().skipped) {  // the loss scaler's overflow: every rank skips the optimizer step
          s.engine->skip_step();
          StepOutcome skipped = out.value();
          s.engine->fill_times(skipped);
          return skipped;
        }
        if (!std::isfinite(out.value().grad_norm))
          return make_actor_error(ActorErrc::diverged,
                                  "the gradient norm is not finite at optimizer step " + std::to_string(req.step.step) +
                                      " -- the run diverged: lower --lr, raise --lr-warmup-iters or set --clip-grad");
        // AdamW runs in the optimizer partition actor; the rank resumes with the all-gathers.
        auto rp = self->make_response_promise<StepOutcome>();
        const auto t0 = std::chrono::steady_clock::now();
        self->request(s.optimizer, caf::infinite, step_atom::value, req.step)
            .then(
                [self, rp, outcome = out.value(), t0](ok_atom) mutable {
                  auto& st = self->state;
                  st.engine->record("optimizer", "optimizer", t0);
                  if (Status done = st.engine->finish_step(); !done) {
                    rp.deliver(rank_error(st.rank, done));
                    return;
                  }
                  outcome.params_norm = st.engine->params_norm();
                  st.engine->fill_times(outcome);
                  rp.deliver(outcome);
                },
                [rp](caf::error& err) mutable { rp.deliver(std::move(err)); });
        return rp;
      },
      [self](eval_atom, const Tensor& tokens) -> caf::result<double> {
        auto& s = self->state;
        if (!s.created) return rank_error(s.rank, s.created);
        auto out = s.engine->eval_loss_sum(tokens);
        if (!out) return rank_error(s.rank, out.status());
        return out.value();
      },
      [self](tensor_atom, const std::string& name, int32_t kind) -> caf::result<RankPieces> {
        auto& s = self->state;
        if (!s.created) return rank_error(s.rank, s.created);
        const auto k = static_cast<TensorKind>(kind);
        if (k == TensorKind::value) return RankPieces{s.rank, s.engine->tensor_pieces(name, k, {}, {})};
        if ((k != TensorKind::exp_avg && k != TensorKind::exp_avg_sq) || !s.optimizer)
          return rank_error(s.rank, Status::error("only values and Adam moments are read between steps"));
        auto rp = self->make_response_promise<RankPieces>();
        self->request(s.optimizer, caf::infinite, save_atom::value)
            .then(
                [self, rp, name, k](OptimizerMoments& m) mutable {
                  auto& st = self->state;
                  rp.deliver(RankPieces{st.rank, st.engine->tensor_pieces(name, k, m.exp_avg, m.exp_avg_sq)});
                },
                [rp](caf::error& err) mutable { rp.deliver(std::move(err)); });
        return rp;
      },
      [self](names_atom) -> std::vector<std::string> {
        std::vector<std::string> out;
        if (self->state.engine)
          for (const auto& [name, shape] : self->state.engine->parameter_names()) out.push_back(name);
        return out;
      },
      [self](spans_atom) -> RankTimeline {
        auto& s = self->state;
        RankTimeline t;
        t.rank = s.rank;
        if (s.engine) {
          t.stage = s.engine->stage();
          t.spans = s.engine->take_spans();
        }
        return t;
      },
      [self](memory_atom) -> RankMemory {
        auto& s = self->state;
        RankMemory m;
        m.rank = s.rank;
        if (s.engine) m.memory = s.engine->memory();
        return m;
      },
      [self, trains](save_atom, const SaveRequest& req) -> caf::result<ok_atom> {
        auto& s = self->state;
        if (!s.created) return rank_error(s.rank, s.created);
        if (Status st = trains(); !st) return rank_error(s.rank, st);
        auto rp = self->make_response_promise<ok_atom>();
        self->request(s.optimizer, caf::infinite, save_atom::value)
            .then(
                [self, rp, req](OptimizerMoments& m) mutable {
                  auto& st = self->state;
                  Status done = prepare_iteration_dir(req.dir, req.iteration);
                  if (!done) {
                    rp.deliver(rank_error(st.rank, done));
                    return;
                  }
                  // The snapshot: host copies of the rank's pieces (the training goes on changing them).
                  ShardWrite w;
                  w.path = shard_file_path(req.dir, req.iteration, st.rank);
                  w.rank = st.rank;
                  w.iteration = req.iteration;
                  w.contents = st.engine->shard_contents(m.exp_avg, m.exp_avg_sq, /*moments_are_copies=*/true);
                  if (req.memory) w.recycler = st.snapshot_buffers;
                  if (st.offload) {  // written in the background
                    caf::anon_send(st.offload, write_atom::value, std::move(w));
                  } else {
                    if (Status wrote = write_shard_file(w.path, w.rank, w.contents); !wrote) {
                      rp.deliver(rank_error(st.rank, wrote));
                      return;
                    }
                    crash_if_asked(req.iteration);
                  }
                  rp.deliver(ok_atom::value);
                },
                [rp](caf::error& err) mutable { rp.deliver(std::move(err)); });
        return rp;
      },
      [self, trains](load_atom, const LoadRequest& req) -> caf::result<ok_atom> {
        auto& s = self->state;
        if (!s.created) return rank_error(s.rank, s.created);
        if (req.load_optimizer)
          if (Status st = trains(); !st) return rank_error(s.rank, st);
        auto checkpoint = Checkpoint::open(req.dir, req.iteration);  // any version, any layout
        if (!checkpoint) return rank_error(s.rank, checkpoint.status());
        // Each file is checked before the first value this rank reads from it, not at open: a rank
        // reads a few shards, and checking every one would read the whole checkpoint once per
        // process (every shard is still checked by the rank of the same layout that reads it).
        // A multi-host snapshot says which shards each rank reads: its host's folder holds those.
        ShardReadOptions deferred;
        deferred.verify_at_open = false;
        auto reader = checkpoint->reader_for(s.rank, s.world_size, s.layout_json, deferred);
        if (!reader) return rank_error(s.rank, reader.status());
        OptimizerMoments m;
        if (req.load_optimizer) {
          for (const AdamSegment& seg : s.engine->adam_segments()) {
            m.exp_avg.push_back(Tensor::zeros(seg.param.shape(), seg.param.dtype()));
            m.exp_avg_sq.push_back(Tensor::zeros(seg.param.shape(), seg.param.dtype()));
          }
        }
        if (Status st = s.engine->load_shards(**reader, m.exp_avg, m.exp_avg_sq); !st) return rank_error(s.rank, st);
        if (!req.load_optimizer) return ok_atom::value;
        auto rp = self->make_response_promise<ok_atom>();
        self->request(s.optimizer, caf::infinite, load_atom::value, std::move(m))
            .then([rp](ok_atom) mutable { rp.deliver(ok_atom::value); },
                  [rp](caf::error& err) mutable { rp.deliver(std::move(err)); });
        return rp;
      },
  };
}

// The group forwards each command to every local rank and replies when all did; replies are
// collected in a shared vector so they can be combined in rank order (deterministic).
struct GroupState {
  std::optional<comm::Topology> topo;  // Topology has no empty state
  std::vector<rank_actor> ranks;
  std::vector<int> global;
  int micro_batch = 1;
  std::set<int> waiting;  // global ranks that have not answered the current step or evaluation
};

template <class T>
struct Gather {
  std::vector<T> items;
  size_t remaining = 0;
};

// Sends the same command to every local rank; ok once all of them are.
template <class Atom, class Request>
caf::result<ok_atom> all_ok(group_actor::stateful_pointer<GroupState> self, Atom atom, const Request& req) {
  auto rp = self->make_response_promise<ok_atom>();
  auto left = std::make_shared<size_t>(self->state.ranks.size());
  for (const auto& r : self->state.ranks) {
    self->request(r, caf::infinite, atom, req)
        .then(
            [rp, left](ok_atom) mutable {
              if (--*left == 0) rp.deliver(ok_atom::value);
            },
            [rp](caf::error& err) mutable { rp.deliver(std::move(err)); });
  }
  return rp;
}

group_actor::behavior_type group_behavior(group_actor::stateful_pointer<GroupState> self, comm::Topology topo,
                                          std::vector<rank_actor> ranks, std::vector<int> global, int micro_batch) {
  name_exceptions(self, "the replica group");
  self->state.micro_batch = micro_batch;
  self->state.topo = std::move(topo);
  self->state.ranks = std::move(ranks);
  self->state.global = std::move(global);
  for (const auto& r : self->state.ranks) self->monitor(r);
  // A rank that dies takes the job with it: the trainer monitors the group.
  self->set_down_handler([self](caf::down_msg& msg) { self->quit(msg.reason); });

  // Windows [d*n/dp, (d+1)*n/dp) of n go to replica d.
  auto replica_rows = [self](const Tensor& batch, int rank) {
    const auto [lo, hi] = replica_windows(batch.dim(0), self->state.micro_batch, self->state.topo->sizes().dp,
                                          self->state.topo->coords(rank).dp);
    return batch.rows(lo, hi);
  };

  return {
      [self](init_atom, uint64_t seed) -> caf::result<ok_atom> {
        auto rp = self->make_response_promise<ok_atom>();
        auto left = std::make_shared<size_t>(self->state.ranks.size());
        for (const auto& r : self->state.ranks) {
          self->request(r, caf::infinite, init_atom::value, seed)
              .then(
                  [rp, left](ok_atom) mutable {
                    if (--*left == 0) rp.deliver(ok_atom::value);
                  },
                  [rp](caf::error& err) mutable { rp.deliver(std::move(err)); });
        }
        return rp;
      },
      [self, replica_rows](train_step_atom, const Tensor& batch, double grad_scale,
                           const StepRequest& step) -> caf::result<GroupStepResult> {
        auto rp = self->make_response_promise<GroupStepResult>();
        auto acc = std::make_shared<Gather<StepOutcome>>();
        acc->items.resize(self->state.ranks.size());
        acc->remaining = self->state.ranks.size();
        self->state.waiting = std::set<int>(self->state.global.begin(), self->state.global.end());
        for (size_t i = 0; i < self->state.ranks.size(); ++i) {
          RankStepRequest req;
          req.tokens = replica_rows(batch, self->state.global[i]);
          req.grad_scale = grad_scale;
          req.step = step;
          self->request(self->state.ranks[i], caf::infinite, train_step_atom::value, std::move(req))
              .then(
                  [self, rp, acc, i](const StepOutcome& out) mutable {
                    self->state.waiting.erase(self->state.global[i]);
                    acc->items[i] = out;
                    if (--acc->remaining > 0) return;
                    GroupStepResult r;
                    r.loss_sum = acc->items[0].loss_sum;
                    r.grad_norm = acc->items[0].grad_norm;
                    r.skipped = acc->items[0].skipped;
                    r.stop = acc->items[0].stop;
                    r.regroup = acc->items[0].regroup;
                    r.control = acc->items[0].control;
                    r.zeros_in_grad = acc->items[0].zeros_in_grad;
                    r.params_norm = acc->items[0].params_norm;
                    r.moe = std::move(acc->items[0].moe);
                    r.world_sections = std::move(acc->items[0].world_sections);
                    for (size_t k = 0; k < acc->items.size(); ++k)
                      if (!acc->items[k].captured.empty())
                        r.captured.push_back(RankPieces{self->state.global[k], std::move(acc->items[k].captured)});
                    r.busy_fraction_min = 1;
                    for (auto& o : acc->items) r.rank_timers.push_back(std::move(o.timers));
                    for (const auto& o : acc->items) {
                      r.max_busy_us = std::max(r.max_busy_us, o.busy_us);
                      r.step_us = std::max(r.step_us, o.step_us);
                      const double f = o.step_us > 0 ? std::min(1.0, o.busy_us / o.step_us) : 0.0;
                      r.busy_fraction_min = std::min(r.busy_fraction_min, f);
                      r.busy_fraction_max = std::max(r.busy_fraction_max, f);
                    }
                    rp.deliver(r);
                  },
                  [rp](caf::error& err) mutable { rp.deliver(std::move(err)); });
        }
        return rp;
      },
      [self, replica_rows](eval_atom, const Tensor& batch) -> caf::result<double> {
        auto rp = self->make_response_promise<double>();
        auto acc = std::make_shared<Gather<double>>();
        acc->items.resize(self->state.ranks.size());
        acc->remaining = self->state.ranks.size();
        self->state.waiting = std::set<int>(self->state.global.begin(), self->state.global.end());
        for (size_t i = 0; i < self->state.ranks.size(); ++i) {
          self->request(self->state.ranks[i], caf::infinite, eval_atom::value, replica_rows(batch, self->state.global[i]))
              .then(
                  [self, rp, acc, i](double loss) mutable {
                    self->state.waiting.erase(self->state.global[i]);
                    acc->items[0] = loss;  // every rank holds the all-reduced sum
                    if (--acc->remaining == 0) rp.deliver(acc->items[0]);
                  },
                  [rp](caf::error& err) mutable { rp.deliver(std::move(err)); });
        }
        return rp;
      },
      [self](spans_atom) -> caf::result<std::vector<RankTimeline>> {
        auto rp = self->make_response_promise<std::vector<RankTimeline>>();
        auto acc = std::make_shared<Gather<RankTimeline>>();
        acc->items.resize(self->state.ranks.size());
        acc->remaining = self->state.ranks.size();
        for (size_t i = 0; i < self->state.ranks.size(); ++i) {
          self->request(self->state.ranks[i], caf::infinite, spans_atom::value)
              .then(
                  [rp, acc, i](RankTimeline& t) mutable {
                    acc->items[i] = std::move(t);
                    if (--acc->remaining == 0) rp.deliver(std::move(acc->items));
                  },
                  [rp](caf::error& err) mutable { rp.deliver(std::move(err)); });
        }
        return rp;
      },
      [self](tensor_atom, const std::string& name, int32_t kind) -> caf::result<std::vector<RankPieces>> {
        auto rp = self->make_response_promise<std::vector<RankPieces>>();
        auto acc = std::make_shared<Gather<RankPieces>>();
        acc->items.resize(self->state.ranks.size());
        acc->remaining = self->state.ranks.size();
        for (size_t i = 0; i < self->state.ranks.size(); ++i) {
          self->request(self->state.ranks[i], caf::infinite, tensor_atom::value, name, kind)
              .then(
                  [rp, acc, i](RankPieces& p) mutable {
                    acc->items[i] = std::move(p);
                    if (--acc->remaining == 0) rp.deliver(std::move(acc->items));
                  },
                  [rp](caf::error& err) mutable { rp.deliver(std::move(err)); });
        }
        return rp;
      },
      [self](names_atom) -> caf::result<std::vector<std::string>> {
        auto rp = self->make_response_promise<std::vector<std::string>>();
        auto acc = std::make_shared<Gather<std::vector<std::string>>>();
        acc->items.resize(self->state.ranks.size());
        acc->remaining = self->state.ranks.size();
        for (size_t i = 0; i < self->state.ranks.size(); ++i) {
          self->request(self->state.ranks[i], caf::infinite, names_atom::value)
              .then(
                  [rp, acc, i](std::vector<std::string>& names) mutable {
                    acc->items[i] = std::move(names);
                    if (--acc->remaining > 0) return;
                    std::vector<std::string> all;
                    for (auto& n : acc->items) all.insert(all.end(), n.begin(), n.end());
                    std::sort(all.begin(), all.end());
                    all.erase(std::unique(all.begin(), all.end()), all.end());
                    rp.deliver(std::move(all));
                  },
                  [rp](caf::error& err) mutable { rp.deliver(std::move(err)); });
        }
        return rp;
      },
      [self](pending_atom) {
        return std::vector<int>(self->state.waiting.begin(), self->state.waiting.end());
      },
      [self](save_atom, const SaveRequest& req) -> caf::result<ok_atom> { return all_ok(self, save_atom::value, req); },
      [self](load_atom, const LoadRequest& req) -> caf::result<ok_atom> { return all_ok(self, load_atom::value, req); },
      [self](memory_atom) -> caf::result<std::vector<RankMemory>> {
        auto rp = self->make_response_promise<std::vector<RankMemory>>();
        auto acc = std::make_shared<Gather<RankMemory>>();
        acc->items.resize(self->state.ranks.size());
        acc->remaining = self->state.ranks.size();
        for (size_t i = 0; i < self->state.ranks.size(); ++i) {
          self->request(self->state.ranks[i], caf::infinite, memory_atom::value)
              .then(
                  [rp, acc, i](RankMemory& m) mutable {
                    acc->items[i] = std::move(m);
                    if (--acc->remaining == 0) rp.deliver(std::move(acc->items));
                  },
                  [rp](caf::error& err) mutable { rp.deliver(std::move(err)); });
        }
        return rp;
      },
  };
}

}  // namespace

rank_actor spawn_rank(caf::actor_system& system, const RankSpec& spec, const comm::Topology& topology, int rank,
                      std::shared_ptr<comm::CommWorld> world, offload_actor offload,
                      OptimizerOffload optimizer_offload, std::shared_ptr<ActivityBoard> board,
                      std::shared_ptr<comm::FlightRecorder> flight) {
  return system.spawn<caf::detached>(rank_behavior, spec, topology, rank, std::move(world), std::move(offload),
                                     std::move(optimizer_offload), std::move(board), std::move(flight));
}

group_actor spawn_group(caf::actor_system& system, const comm::Topology& topology, std::vector<rank_actor> ranks,
                        std::vector<int> global_ranks, int micro_batch) {
  return system.spawn(group_behavior, topology, std::move(ranks), std::move(global_ranks), micro_batch);
}

void RankSet::exit(caf::local_actor* self) const {
  self->send_exit(group, caf::exit_reason::user_shutdown);
  for (const auto& r : ranks) self->send_exit(r, caf::exit_reason::user_shutdown);
}

Result<RankSet> spawn_ranks(caf::actor_system& system, const RankSpec& spec, std::shared_ptr<comm::CommWorld> world,
                            offload_actor offload, const OptimizerOffload& optimizer_offload,
                            comm::LocalFabricOptions fabric_options) {
  comm::ParallelSizes sizes;
  sizes.tp = spec.par.tp;
  sizes.pp = spec.par.pp;
  sizes.dp = spec.par.dp;
  sizes.cp = spec.par.cp;
  const int size = spec.par.world_size();
  auto topo = comm::Topology::create(sizes, size);
  if (!topo) return topo.status();
  RankSet out;
  out.topology = topo.value();
  auto board = [&](int r) {
    const comm::Coords at = topo.value().coords(r);
    auto b = std::make_shared<ActivityBoard>(r, at.pp, at.tp, at.dp, spec.par.cp > 1 ? at.cp : -1);
    out.boards.push_back(b);
    return b;
  };
  auto flight = [&](int r) {
    auto f = std::make_shared<comm::FlightRecorder>(r);
    out.flights.push_back(f);
    return f;
  };
  std::vector<int> global;
  if (world) {  // one rank per process
    out.ranks.push_back(
        spawn_rank(system, spec, topo.value(), world->rank(), world, offload, optimizer_offload, board(world->rank()),
                   flight(world->rank())));
    global.push_back(world->rank());
  } else {
    auto fabric = comm::LocalFabric::create(size, fabric_options);
    if (!fabric) return fabric.status();
    out.fabric = std::move(fabric).value();
    for (int r = 0; r < size; ++r) {
      out.ranks.push_back(
          spawn_rank(system, spec, topo.value(), r, out.fabric->world(r), offload, optimizer_offload, board(r), flight(r)));
      global.push_back(r);
    }
  }
  out.group = spawn_group(system, topo.value(), out.ranks, global, spec.micro_batch_size);
  return out;
}

}  // namespace troupe
