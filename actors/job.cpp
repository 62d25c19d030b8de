#include "actors/job.hpp"
#include "kernels/device_info.hpp"
#include "engine/activity.hpp"
#include "engine/flight_report.hpp"
#include "model/pipeline_model.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <cmath>
#include <thread>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "actors/data_loader.hpp"
#include "actors/errors.hpp"
#include "inspect/dashboard.hpp"
#include "inspect/inspect_stages.hpp"
#include "inspect/inspector.hpp"
#include "inspect/trace_command.hpp"
#include "actors/offload_actor.hpp"
#include "actors/rank_actor.hpp"
#include "actors/supervisor.hpp"
#include "config/imported_config.hpp"
#include "config/memory_estimate.hpp"
#include "engine/snapshot_copies.hpp"
#include "config/run_identity.hpp"
#include "config/stored_config.hpp"
#include "engine/timeline.hpp"
#include "actors/trainer.hpp"
#include "comm/local/local_world.hpp"
#include "comm/topology.hpp"
#include "config/validate.hpp"
#include "engine/fault_injection.hpp"
#include "comm/bootstrap/launch_env.hpp"
#include "engine/goodput.hpp"
#include "engine/lifecycle.hpp"
#include "engine/run_start.hpp"
#include "engine/nan_watch.hpp"
#include "kernels/peak.hpp"
#include "storage/checkpoint.hpp"
#include "storage/hf_import.hpp"
#include "storage/sharded_checkpoint.hpp"

namespace troupe {

namespace {

// Compute runs on the shards' own threads; CAF's scheduler only routes messages, so a small pool with
// the condition-variable ("sharing") policy keeps it from spinning against the compute threads.
caf::actor_system_config make_system_config() {
  caf::actor_system_config cfg;
  cfg.set("scheduler.max-threads", 2);
  cfg.set("scheduler.policy", caf::atom("sharing"));
  return cfg;
}

// Asks `dest` and waits for the reply on the calling thread; returns the error text on failure.
template <class Handle, class... Ts>
Status ask_ok(caf::scoped_actor& self, const Handle& dest, Ts&&... xs) {
  Status result;
  self->request(dest, caf::infinite, std::forward<Ts>(xs)...)
      .receive([](ok_atom) {}, [&](caf::error& err) { result = to_status(err); });
  return result;
}

}  // namespace

Result<TrainConfig> checkpoint_config(const std::string& dir) { return stored_config(dir); }

// Runs the trainer to completion, relaying its reports to the callbacks on this thread. A watchdog:
// when nothing reports progress (an iteration, an evaluation, a save) for
// --distributed-timeout-minutes, a rank is stuck; the job fails naming the ranks of this process
// that did not finish, and sets *stuck (their actors cannot be torn down). Before that, a stall
// (no rank of `boards` changed what it does for --inspect-stall-seconds) is reported once per
// iteration: who waits on whom and the culprit in one line, every rank's activity, flight record
// and this process's stacks in a JSON file.
Result<TrainSummary> drive_trainer(caf::actor_system& system, caf::scoped_actor& self, const TrainerSpec& spec,
                                   const JobCallbacks& callbacks, const JobOptions& options, bool* stuck,
                                   const std::vector<std::shared_ptr<const ActivityBoard>>& boards,
                                   const Flights& flights, std::atomic<int64_t>* iteration_now) {
  using Clock = std::chrono::steady_clock;
  const TrainConfig& config = spec.config;
  auto note = [&](const std::string& s) {
    if (callbacks.on_note) callbacks.on_note(s);
  };
  trainer_actor trainer = spawn_trainer(system, spec);
  self->monitor(trainer);
  if (spec.control) spec.control->set_wake([trainer] { caf::anon_send(trainer, control_atom::value); });
  std::optional<int64_t> log_interval;
  self->send(trainer, run_atom::value);
  bool running = true, stop_sent = false;
  std::optional<TrainSummary> summary;
  Status failure;
  // Later than the local fabric's own timeout (the same value), which names the missing ranks.
  const auto timeout = std::chrono::duration<double, std::ratio<60>>(config.distributed_timeout_minutes) * 1.2 +
                       std::chrono::seconds(2);
  auto last_progress = Clock::now();
  int64_t last_iteration = spec.start_iteration;
  bool regroup_noted = false;
  auto check_stop = [&] {
    if (options.regroup && options.regroup->load() && !regroup_noted) {
      regroup_noted = true;
      const bool memory = config.save_memory_interval > 0;
      note(memory || !config.save.empty()
               ? "a node asks to join the job: stopping " +
                     std::string(memory ? "at the next in-memory snapshot" : "after this iteration, saving a checkpoint") +
                     ", for the launchers to start a round with it"
               : "a node asks to join the job, but there is nothing to resume from (no --save-memory-interval, no "
                 "--save): it waits for the next restart");
    }
    if (options.stop && options.stop->load() && !stop_sent) {
      stop_sent = true;
      self->send(trainer, stop_atom::value);
      note("stopping after the current iteration" + std::string(config.save.empty() ? "" : " and saving a checkpoint"));
    }
  };
  const double stall_seconds = config.inspect_stall_seconds > 0
                                   ? config.inspect_stall_seconds
                                   : std::min(60.0, config.distributed_timeout_minutes * 30.0);
  bool stall_reported = false;
  auto report_stall = [&] {
    if (stall_reported || boards.empty() || std::chrono::duration<double>(Clock::now() - last_progress).count() < stall_seconds)
      return;
    std::vector<Activity> now;
    double quiet = 1e300;
    for (const auto& board : boards) {
      now.push_back(board->snapshot());
      quiet = std::min(quiet, now.back().seconds_since_progress);
    }
    if (quiet < stall_seconds) return;  // some rank is still moving
    stall_reported = true;
    const WaitGraph where = wait_graph(now);
    if (where.edges.empty()) return;  // nobody waits on anybody: a long save or a slow step, not a stall
    const std::filesystem::path file =
        std::filesystem::path(config.save.empty() ? "." : config.save) / ("troupe-stall-" + std::to_string(::getpid()) + ".json");
    std::error_code ec;
    if (!config.save.empty()) std::filesystem::create_directories(config.save, ec);
    std::string saved = " (every rank's activity, flight record and this process's stacks in " + file.string() + ")";
    if (FILE* f = std::fopen(file.c_str(), "w")) {
      const std::string json = with_flight_and_stacks(stall_report_json(now, where, quiet, last_iteration), flights);
      const bool ok = std::fwrite(json.data(), 1, json.size(), f) == json.size();
      if (std::fclose(f) != 0 || !ok) saved = " (could not write " + file.string() + ")";
    } else {
      saved = " (could not write " + file.string() + ")";
    }
    char head[96];
    std::snprintf(head, sizeof head, "stall: no rank of this process made progress for %.1f s after iteration %lld: ",
                  quiet, static_cast<long long>(last_iteration));
    note(head + where.summary + saved);
  };
  auto watchdog = [&] {
    check_stop();
    if (spec.control && spec.control->paused()) {  // paused from the inspector: not stuck
      last_progress = Clock::now();
      return;
    }
    report_stall();
    if (Clock::now() - last_progress < timeout) return;
    std::string who = "rank(s) of this process";
    self->request(spec.group, std::chrono::seconds(2), pending_atom::value)
        .receive(
            [&](std::vector<int>& ranks) {
              std::string list;
              for (int r : ranks) list += (list.empty() ? "" : ", ") + std::to_string(r);
              who = ranks.empty() ? "no rank of this process (a peer process is stuck)" : "rank(s) " + list;
            },
            [&](caf::error&) {});
    char minutes[32];
    std::snprintf(minutes, sizeof minutes, "%g", config.distributed_timeout_minutes);
    failure = Status::error("no progress for " + std::string(minutes) + " minute(s) after iteration " +
                            std::to_string(last_iteration) + ": " + who + " did not finish iteration " +
                            std::to_string(last_iteration + 1) +
                            " (stuck, or waiting for a stuck peer) -- find what blocks it (the timeline, a debugger), "
                            "or raise --distributed-timeout-minutes if iterations are that slow");
    *stuck = true;
    running = false;
  };
  self->receive_while(running)(
      [&](progress_atom, const IterationStats& s) {
        last_progress = Clock::now();
        stall_reported = false;
        last_iteration = s.iteration;
        iteration_now->store(s.iteration);
        if (spec.control) {  // set log-interval from the inspector
          const auto asked = spec.control->state().log_interval;
          if (asked && asked != log_interval && callbacks.on_log_interval) callbacks.on_log_interval(*asked);
          log_interval = asked;
        }
        if (callbacks.on_iteration) callbacks.on_iteration(s);
        check_stop();
      },
      [&](eval_atom, const EvalStats& e) {
        last_progress = Clock::now();
        if (callbacks.on_eval) callbacks.on_eval(e);
        check_stop();
      },
      [&](save_atom, const SavedCheckpoint& c) {
        last_progress = Clock::now();
        if (callbacks.on_saved) callbacks.on_saved(c);
      },
      [&](done_atom, const TrainSummary& s) {
        summary = s;
        running = false;
      },
      [&](failed_atom, const std::string& message) {
        failure = Status::error(message);
        running = false;
      },
      [&](caf::down_msg& msg) {
        if (msg.source == trainer) {
          if (!summary && failure.is_ok()) {
            const std::string why = describe(msg.reason);  // "the trainer failed: ..." names itself
            failure = Status::error(why.rfind("the trainer", 0) == 0 ? why : "the trainer stopped unexpectedly: " + why);
          }
        } else {  // another supervised actor (the offload actor) died: the job cannot go on
          if (failure.is_ok()) failure = Status::error(describe(msg.reason));
          self->send_exit(trainer, caf::exit_reason::user_shutdown);
        }
        running = false;
      },
      caf::after(std::chrono::milliseconds(100)) >> watchdog);
  if (*stuck) {
    self->send_exit(trainer, caf::exit_reason::user_shutdown);
    if (options.on_stuck) options.on_stuck(failure.message());
  }
  if (!failure.is_ok()) return failure;
  return *summary;
}

namespace {

// The world's layout (Topology::describe): expert parallelism is carved out of dp (docs/MOE.md), not
// a dimension of the world, so its size is shown there.
std::string layout_description(const comm::Topology& topo, int ep) {
  std::string d = topo.describe();
  if (ep > 1) {
    const size_t at = d.find(" ep=1");
    const std::string shown = " ep=" + std::to_string(ep) + " (of dp)";
    if (at != std::string::npos) d.replace(at, 5, shown);
    else d += shown;
  }
  return d;
}

// The process's offload actor (monitored by `self`: its death stops the job): it writes the
// checkpoint shards of this process in the background, then completes each save: after a barrier
// over the job's processes, one of them writes the metadata and the latest pointer.
struct Offload {
  offload_actor actor;
  std::shared_ptr<std::atomic<int>> saves_in_flight = std::make_shared<std::atomic<int>>(0);
  std::shared_ptr<std::atomic<int64_t>> mailbox = std::make_shared<std::atomic<int64_t>>(0);
  std::shared_ptr<std::atomic<bool>> draining = std::make_shared<std::atomic<bool>>(false);
  // The trainer's completion of a save: the workers handed their snapshots to the offload actor,
  // which writes them and then commits, in that order, while training goes on.
  std::function<Status(const SaveRequest&)> commit() const {
    return [actor = actor, in_flight = saves_in_flight](const SaveRequest& r) {
      in_flight->fetch_add(1);
      caf::anon_send(actor, commit_atom::value, r);
      return Status::ok();
    };
  }
};

Offload start_offload(caf::actor_system& system, caf::scoped_actor& self, const TrainConfig& config,
                      const JobOptions& options, int world, std::string layout_json, std::shared_ptr<HostPool> pool,
                      SnapshotCopies* copies, std::shared_ptr<const CoverageSlot> coverage) {
  auto commit = [&config, &options, world, layout = std::move(layout_json), copies,
                 coverage = std::move(coverage)](const SaveRequest& r) {
    const std::string key = "save " + std::to_string(r.iteration);
    if (options.bootstrap != nullptr) {
      // Another process failed before its shards were written: this save cannot complete, and its
      // shards of this process are freed (no empty or unfinished iter_ folder stays behind).
      if (Status st = options.bootstrap->barrier(key + " shards"); !st) {
        discard_unfinished_save(iteration_dir(r.dir, r.iteration));
        return st;
      }
    }
    if (r.memory && copies != nullptr) {
      // A snapshot over several hosts: each shard also goes to the buddy's host folder, and each
      // host's first process commits its folder (every shard's digest in its metadata.json).
      auto exchanged = copies->exchange(r.dir, r.iteration, coverage ? coverage->get() : nullptr);
      if (!exchanged) {
        discard_unfinished_save(iteration_dir(r.dir, r.iteration));
        return exchanged.status();
      }
      if (copies->first_of_host())
        TROUPE_RETURN_IF_ERROR(commit_sharded_checkpoint(r.dir, checkpoint_meta(r, run_json(config.run_id)), layout,
                                                         shard_file_names(world), exchanged->digests,
                                                         exchanged->reads));
    } else if (options.bootstrap == nullptr || options.bootstrap->rank() == 0) {
      TROUPE_RETURN_IF_ERROR(commit_sharded_checkpoint(r.dir, checkpoint_meta(r, run_json(config.run_id)), layout,
                                                       shard_file_names(world)));
    }
    if (options.bootstrap != nullptr) TROUPE_RETURN_IF_ERROR(options.bootstrap->barrier(key + " committed"));
    if (r.memory) drop_older_iterations(r.dir, r.iteration);  // memory holds the newest snapshot only
    return Status::ok();
  };
  Offload offload;
  offload.actor =
      spawn_offload(system, commit, caf::actor_cast<caf::actor>(self), std::move(pool), offload.saves_in_flight,
                    offload.mailbox, offload.draining);
  self->monitor(offload.actor);
  return offload;
}

// No save is lost: waits for the offload actor's queue (shards and commits) before the job ends; a
// failed background save fails a job that otherwise succeeded.
void flush_saves(caf::scoped_actor& self, const Offload& offload, const TrainConfig& config,
                 const JobCallbacks& callbacks, Result<TrainSummary>& result) {
  // In-memory snapshots too: a failed attempt's restart resumes from the one it handed over last.
  if (config.save.empty() && config.save_memory_interval == 0) return;
  offload.draining->store(true);  // training is over: the writer stops yielding the cores
  Status flushed = ask_ok(self, offload.actor, flush_atom::value);
  if (result && !flushed) result = flushed;
  // The saves completed during the flush reported themselves before its reply: pass them on.
  for (bool more = true; more;) {
    self->receive(
        [&](save_atom, const SavedCheckpoint& c) {
          if (callbacks.on_saved) callbacks.on_saved(c);
        },
        [&](caf::down_msg&) {}, caf::after(std::chrono::milliseconds(0)) >> [&] { more = false; });
  }
}

// What the trainer needs besides the rank group (the caller sets that).
// When this process started training (--exit-duration-in-mins counts from here, restarts included,
// as Megatron counts from the start of pretraining).
std::chrono::steady_clock::time_point training_started() {
  static const auto started = std::chrono::steady_clock::now();
  return started;
}

TrainerSpec trainer_spec(const TrainConfig& config, const JobOptions& options, const data_loader_actor& loader,
                         caf::scoped_actor& self, const DataSource& data, double peak, const Offload& offloader) {
  TrainerSpec spec;
  spec.agree_on_stop = options.world != nullptr && options.world->size() > 1;
  spec.regroup = options.regroup;
  if (config.exit_duration_in_mins > 0)
    spec.exit_deadline = training_started() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                  std::chrono::duration<double, std::ratio<60>>(config.exit_duration_in_mins));
  spec.config = config;
  spec.loader = loader;
  spec.listener = caf::actor_cast<caf::actor>(self);
  spec.validation_windows = data.num_windows(DataSplit::validation);
  spec.sgemm_peak_gflops = peak;
  spec.finalize_save = offloader.commit();
  spec.offload = offloader.actor;
  spec.saves_in_flight = offloader.saves_in_flight;
  spec.memory_dir = config.save_memory_interval > 0 ? job_memory_snapshot_dir(config, options) : std::string();
  const ModelReport report = model_report(options.model.get());
  spec.loss_terms_per_sample = report.loss_terms_per_sample;
  spec.gpt_flops = report.gpt_flops;
  return spec;
}

// Loads --load into the ranks (a troupe checkpoint of any version and layout, or a Hugging Face
// folder staged as one: engine/run_start.hpp), or initialises them from the seed, and sets where
// the trainer starts.
Status load_or_init(caf::scoped_actor& self, const group_actor& workers, const TrainConfig& config, TrainerSpec& spec,
                    const std::function<void(const std::string&)>& note) {
  if (config.load.empty()) return ask_ok(self, workers, init_atom::value, config.seed);
  if (is_hf_folder(config.load)) {
    auto staged = stage_hf_folder(config);
    if (!staged) return staged.status();
    TROUPE_RETURN_IF_ERROR(ask_ok(self, workers, load_atom::value, staged.value()->request()));
    note(staged.value()->loaded_note(config));
    return Status::ok();
  }
  auto plan = plan_load(config);
  if (!plan) return plan.status();
  auto point = resume_point(config, plan.value());
  if (!point) return point.status();
  if (config.use_checkpoint_opt_param_scheduler && !config.finetune) use_checkpoint_schedule(spec.config, plan->saved);
  for (const std::string& n : point->before) note(n);
  TROUPE_RETURN_IF_ERROR(ask_ok(self, workers, load_atom::value, point->request));
  for (int64_t unfinished : unfinished_saves(config.load, plan->iteration))
    note("ignored " + iteration_dir(config.load, unfinished) +
         ": an unfinished save (shards without metadata.json: the run stopped while saving)");
  spec.start_iteration = point->start_iteration;
  spec.consumed_samples = point->consumed_samples;
  spec.skipped_steps = point->skipped_steps;
  spec.skipped_samples = point->skipped_samples;
  spec.loss_scaler_state = point->loss_scaler_state;
  spec.optimizer_step_offset = point->optimizer_step_offset;
  note(point->loaded);
  return Status::ok();
}

// The NaN watch of a run (engine/nan_watch.hpp): the control its ranks and the inspector share
// (across restarts: a located NaN ends the run), and TROUPE_FAULT_NAN's fault.
struct NanWatchSetup {
  std::shared_ptr<NanControl> control;
  std::optional<NanFault> fault;
};

// What every attempt of a run shares: the data, the callbacks (feeding the goodput ledger), the
// process's options and compute threads, the measured sgemm peak, the NaN watch and the lifecycle
// the attempt moves on (starting -> training -> stopping).
struct AttemptContext {
  std::shared_ptr<const DataSource> data;
  JobCallbacks callbacks;
  const JobOptions* options = nullptr;
  int threads = 1;
  double peak = 0;
  NanWatchSetup nan;
  JobLifecycle* lifecycle = nullptr;
  SnapshotCopies* copies = nullptr;  // in-memory snapshots over several hosts, else null
};

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The inspector's `watch [nan|off]`: this process's wish, and with rank 0's the other processes'.
InspectHub::Handler watch_command(const InspectHub& hub, std::shared_ptr<NanControl> nan) {
  return [&hub, nan](const InspectCall& call) {
    if (call.args.size() > 1 || (call.args.size() == 1 && call.args[0] != "nan" && call.args[0] != "off"))
      return inspect_error("watch takes nan, off or nothing (whether it is on) -- e.g. watch nan");
    if (call.args.size() == 1) nan->want(call.args[0] == "nan");
    nlohmann::json j = {{"watch", nan->wanted() ? "nan" : "off"}, {"watching", nan->watching()}, {"processes", 1},
                        {"iteration", hub.iteration()}};
    if (call.local) return j.dump() + "\n";
    std::vector<std::string> unreachable;
    int agree = 1, processes = 1;
    for (const std::string& answer : hub.ask_peers(call.line, unreachable)) {
      const auto peer = nlohmann::json::parse(answer, nullptr, false);
      ++processes;
      if (!peer.is_discarded() && peer.value("watch", "") == j["watch"]) ++agree;
      if (!peer.is_discarded() && !peer.value("watching", false)) j["watching"] = false;
    }
    j["processes"] = processes;
    j["agreeing"] = agree;
    j["note"] = "every rank votes at the start of each step; the steps that begin after all of them have it " +
                std::string(nan->wanted() ? "are watched" : "are not watched");
    return with_unreachable(j.dump(1) + "\n", unreachable);
  };
}

}  // namespace

// Every layout, 1x1x1 included: the tp x pp x dp rank actors of this process (all of them on the
// local backend, or this process's one rank under troupe launch), a group actor in front of them,
// the data loader, the offload actor and the trainer.
static Result<TrainSummary> run_ranks(caf::actor_system& system, const TrainConfig& config, const AttemptContext& run,
                                      bool* stuck) {
  const JobCallbacks& callbacks = run.callbacks;
  const JobOptions& options = *run.options;
  const int threads = run.threads;
  const NanWatchSetup& nan = run.nan;
  const std::shared_ptr<const DataSource>& data = run.data;
  auto note = [&](const std::string& s) {
    if (callbacks.on_note) callbacks.on_note(s);
  };
  auto planned = plan_ranks(config, options, threads);
  if (!planned) return planned.status();
  RankSpec rs = std::move(planned).value();
  const int world = rs.par.world_size();
  if (nan.fault) TROUPE_RETURN_IF_ERROR(check_nan_fault(*nan.fault, config.model.num_layers, world));
  rs.nan = nan.control;
  rs.nan_fault = nan.fault;
  // The report file: rank 0's process writes it (the engine, as soon as the ranks agree on it).
  if (options.bootstrap == nullptr || options.bootstrap->rank() == 0)
    nan.control->set_report_file((std::filesystem::path(config.save.empty() ? "." : config.save) /
                                  ("troupe-nan-" + std::to_string(::getpid()) + ".json"))
                                     .string());
  caf::scoped_actor self{system};
  auto pool = std::make_shared<HostPool>();
  // Over several hosts, the rank's coverage goes with the first snapshot (which shards each reads).
  if (run.copies != nullptr) rs.coverage = std::make_shared<CoverageSlot>();
  Offload offloader =
      start_offload(system, self, config, options, world, rs.par.to_json(), pool, run.copies, rs.coverage);
  offload_actor offload = offloader.actor;
  OptimizerOffload optimizer_offload;
  optimizer_offload.device = config.offload_optimizer;
  optimizer_offload.path = config.offload_path;
  optimizer_offload.pool = pool;
  rs.recycle_snapshots = config.save_memory_interval > 0;  // a snapshot every few iterations
  // A wait for a peer longer than --distributed-timeout-minutes fails the in-process fabric naming the
  // ranks that did not arrive (a stuck rank), before drive_trainer's watchdog would.
  comm::LocalFabricOptions fabric_options;
  fabric_options.timeout = std::chrono::milliseconds(static_cast<int64_t>(config.distributed_timeout_minutes * 60'000));
  auto spawned = spawn_ranks(system, rs, options.world, offload, optimizer_offload, fabric_options);
  if (!spawned) {
    self->send_exit(offload, caf::exit_reason::user_shutdown);
    return spawned.status();
  }
  RankSet& ranks = spawned.value();
  const group_actor group = ranks.group;
  const comm::Topology& topo = *ranks.topology;
  data_loader_actor loader = spawn_data_loader(system, data);
  auto shutdown = [&] {
    ranks.exit(self.ptr());
    self->send_exit(offload, caf::exit_reason::user_shutdown);
    self->send_exit(loader, caf::exit_reason::user_shutdown);
  };
  // The layout and memory notes, and the ranks' busy share, are for parallel layouts: a 1x1x1 job
  // prints what it always printed.
  const bool layout_notes = config.parallel() || options.world;
  if (layout_notes)
    note("parallel layout: " + layout_description(topo, rs.par.ep) + ", ZeRO stage " + std::to_string(rs.par.zero_stage) +
       ", schedule " + (options.schedule ? std::string("given as data") : config.pipeline_schedule) +
       (rs.par.virtual_chunks > 1 ? " (" + std::to_string(rs.par.virtual_chunks) + " chunks per stage)" : "") + ", " +
       std::to_string(rs.micro_batches) + " micro-batches per replica, " + std::to_string(rs.num_threads) +
       " compute thread(s) per rank");
  if (rs.device == Device::cuda)
    note("device: GPU " + std::to_string(rs.cuda_device) + " (" + query_devices().cuda_detail +
         "): parameters, gradients, activations and Adam moments in GPU memory; the rank and its optimizer "
         "partition each on a CUDA stream of their own" + (options.world ? "; collectives through NCCL" : ""));
  if (config.offload_optimizer == "cpu")
    note("optimizer offload: cpu (the Adam moments live in the offload actor's host memory pool" +
         std::string(pool->pinned() ? ", pinned" : "") + "; the step runs on each partition's own threads)");
  else if (config.offload_optimizer == "nvme")
    note("optimizer offload: nvme (the Adam moments live in swap files under " + config.offload_path +
         ", read ahead and written back in pieces of " + std::to_string(MomentStore::kPieceElements >> 10) +
         " Ki elements; the files are deleted on exit)");
  TrainerSpec spec = trainer_spec(config, options, loader, self, *data, run.peak, offloader);
  spec.group = group;
  spec.report_busy = layout_notes;
  if (Status st = load_or_init(self, group, config, spec, note); !st) return shutdown(), st;
  // The inspector (--inspect), in the process of rank 0: it answers from this process's boards.
  std::atomic<int64_t> iteration_now{spec.start_iteration};
  InspectHub hub(ranks.boards, &iteration_now);
  auto control = std::make_shared<JobControl>();
  add_control_commands(hub, *control, config);
  spec.control = control;
  control->watch_offload(offloader.saves_in_flight, offloader.mailbox);
  if (!with_dashboard_inspector(config).inspect.empty())
    self->request(group, caf::infinite, names_atom::value)
        .receive([&](std::vector<std::string>& names) { control->set_tensor_names(std::move(names)); },
                 [&](caf::error&) {});
  hub.add("watch", "watch [nan|off]",
          "the NaN locator: nan stops the job at the first non-finite loss, gradient or parameter and names the op it "
          "came from (by replaying the iteration); off stops watching; nothing: whether it is on",
          watch_command(hub, nan.control));
  if (config.watch_nan)
    note("NaN watch on (--watch-nan): every step keeps its inputs and checks the loss, the gradient norm and the "
         "parameters; a failed check replays the iteration to name the op the NaN came from");
  auto history = std::make_shared<IterationHistory>();
  add_stage_commands(hub, {ranks.boards, job_schedule(rs), rs.par.custom_schedule != nullptr, history});
  add_trace_command(hub);
  hub.add("flight", kFlightUsage, kFlightHelp, [&hub, flights = ranks.flights](const InspectCall& c) {
    return flight_answer(flights, c.args, c.local, [&](std::vector<std::string>& u) { return hub.ask_peers(c.line, u); });
  });
  hub.add("stacks", kStacksUsage, kStacksHelp, [&hub, flights = ranks.flights](const InspectCall& c) {
    return stacks_answer(flights, c.args, c.local, [&](std::vector<std::string>& u) { return hub.ask_peers(c.line, u); });
  });
  JobCallbacks fed = callbacks;  // the history of the curves (`history`, the dashboard) sees every iteration
  fed.on_iteration = [&callbacks, history](const IterationStats& s) {
    history->add(s);
    if (callbacks.on_iteration) callbacks.on_iteration(s);
  };
  // --dashboard (rank 0's process): bound first, so that its URL is in the inspect file.
  auto dashboard = bind_dashboard(config, options.bootstrap == nullptr || options.bootstrap->rank() == 0, hub);
  if (!dashboard) return shutdown(), dashboard.status();
  auto inspector = start_inspector(with_dashboard_inspector(config), options.bootstrap, options.job_token, hub, note,
                                   dashboard.value() ? dashboard.value()->url() : "");
  if (!inspector) return shutdown(), inspector.status();
  if (dashboard.value()) {
    dashboard.value()->start();
    note("dashboard on " + dashboard.value()->url());
  }
  run.lifecycle->enter(JobPhase::training);
  auto result = drive_trainer(system, self, spec, fed, options, stuck, ranks.boards, ranks.flights, &iteration_now);
  if (result) run.lifecycle->enter(JobPhase::stopping, result->stopped_early ? "stopped early" : "");
  control->set_wake(nullptr);
  if (dashboard.value()) dashboard.value()->stop();  // served only while the job runs
  if (const auto report = nan.control->report(); !result && report) {  // one line, and where the details are
    const std::string file = nan.control->report_file(), error = nan.control->report_file_error();
    const std::string details = file.empty()   ? " (rank 0's process writes the details to its troupe-nan-PID.json)"
                                : error.empty() ? " -- details in " + file
                                                : " (" + error + ")";
    result = Status::error(report->message() + details);
  }
  if (!inspector.value().file.empty()) std::filesystem::remove(inspector.value().file);
  // A failed or stuck job: where this process's ranks were, and who they waited on (the ranks'
  // boards keep the wait that failed, and a stuck rank's last state). Not after the NaN watch's
  // stop: its ranks were not stuck, and its report says where they were.
  if (!result && !nan.control->report()) {
    std::vector<Activity> now;
    for (const auto& board : ranks.boards) now.push_back(board->snapshot());
    const WaitGraph where = wait_graph(now);
    if (!where.edges.empty()) {
      note("where the ranks were: " + where.summary);
      for (const Activity& a : now) note("  " + a.describe());
    }
  }
  flush_saves(self, offloader, config, callbacks, result);
  // A failed job may leave ranks blocked in a collective whose peer gave up: failing the fabric
  // fails their pending operations, so every rank actor returns and the actor system can shut down.
  if (!result && ranks.fabric) ranks.fabric->abort(0, result.status().message());
  if (result && layout_notes) {  // model-state bytes per rank against ZeRO's formula
    self->request(group, caf::infinite, memory_atom::value)
        .receive(
            [&](std::vector<RankMemory>& ranks_memory) {
              for (const RankMemory& rm : ranks_memory) {
                const MemoryReport& m = rm.memory;
                const double mib = 1.0 / (1 << 20);
                const double total = static_cast<double>(m.param_bytes + m.grad_bytes + m.optimizer_bytes);
                char line[400];
                std::snprintf(line, sizeof line,
                              "rank %d model states: parameters %.2f MiB, gradients %.2f MiB, optimizer %.2f MiB = "
                              "%.2f MiB; ZeRO-%d formula %.2f MiB (x%.3f); ZeRO buffers peak %.2f MiB",
                              rm.rank, m.param_bytes * mib, m.grad_bytes * mib, m.optimizer_bytes * mib, total * mib,
                              m.zero_stage, m.formula_bytes() * mib, total / m.formula_bytes(),
                              m.transient_peak_bytes * mib);
                // Where the optimizer's bytes are: the formula counts them as model states wherever
                // they live.
                const std::string where = config.offload_optimizer == "nvme" ? "; the optimizer's bytes are in swap files"
                                          : config.offload_optimizer == "cpu"
                                              ? "; the optimizer's bytes are in the host memory pool"
                                              : "";
                note(line + where);
              }
            },
            [&](caf::error&) {});
  }
  if (result && !config.timeline.empty()) {
    Status written;
    self->request(group, caf::infinite, spans_atom::value)
        .receive(
            [&](std::vector<RankTimeline>& timelines) {
              if (options.bootstrap != nullptr) {  // under launch: rank 0 writes every rank's spans
                auto all = options.bootstrap->all_gather("timeline", timelines_to_json(timelines));
                if (!all) {
                  written = all.status();
                  return;
                }
                if (options.bootstrap->rank() != 0) return;
                timelines.clear();
                for (const std::string& blob : all.value()) {
                  auto part = timelines_from_json(blob);
                  if (!part) {
                    written = part.status();
                    return;
                  }
                  for (auto& t : part.value()) timelines.push_back(std::move(t));
                }
              }
              written = write_chrome_trace(config.timeline, topo, timelines);
            },
            [&](caf::error& err) { written = Status::error(describe(err)); });
    if (!written) return shutdown(), written;
    note("timeline of the first 20 iterations written to " + config.timeline);
  }
  shutdown();
  return result;
}

namespace {

// The callbacks of an attempt: the caller's, with the goodput ledger fed on the way
// (engine/goodput.hpp: every step, evaluation and save of every attempt).
JobCallbacks counted_callbacks(const JobCallbacks& callbacks, std::shared_ptr<GoodputLedger> ledger, int pp) {
  JobCallbacks counted = callbacks;
  counted.on_iteration = [on = callbacks.on_iteration, ledger, pp](const IterationStats& s) {
    const double now = steady_seconds(), seconds = s.ms_per_iter / 1e3;
    if (!ledger->in_attempt()) ledger->attempt_started(now - seconds);
    ledger->step(now, s.iteration, seconds, GoodputLedger::bubble_seconds(s, pp), GoodputLedger::straggler_seconds(s));
    if (on) on(s);
  };
  counted.on_eval = [on = callbacks.on_eval, ledger](const EvalStats& e) {
    ledger->evaluation(steady_seconds(), e.seconds);
    if (on) on(e);
  };
  counted.on_saved = [on = callbacks.on_saved, ledger](const SavedCheckpoint& c) {
    if (!c.committed) ledger->save(steady_seconds(), c.seconds);  // the snapshot: in the training path
    if (on) on(c);
  };
  return counted;
}

// One attempt of run_training: an actor system with every actor of the job, from `config.load` or
// from the seed. When a rank is stuck its actor can never be torn down, and the actor system would
// wait for it for ever on destruction: it is left behind (with its threads) and the error returned.
Result<TrainSummary> run_attempt(const TrainConfig& config, const AttemptContext& run, bool* stuck) {
  auto sys_cfg = std::make_unique<caf::actor_system_config>(make_system_config());
  auto system = std::make_unique<caf::actor_system>(*sys_cfg);
  auto result = run_ranks(*system, config, run, stuck);
  // Every actor was told to exit; one that does not within seconds is stuck in a handler (a failed
  // job whose stuck rank the fabric's timeout named, rather than the watchdog).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!*stuck && system->registry().running() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  if (!*stuck && system->registry().running() > 0) {
    *stuck = true;
    const std::string message =
        (result ? std::string("the job finished") : result.status().message()) + "; " +
        std::to_string(system->registry().running()) + " actor(s) did not stop (stuck in a handler)";
    if (run.options->on_stuck) run.options->on_stuck(message);
    if (result) result = Status::error(message);
  }
  if (*stuck) {  // deliberately leaked: see above
    (void)system.release();
    (void)sys_cfg.release();
  }
  return result;
}

}  // namespace

// A run in this process: it resolves the run here, then hands it to the supervisor actor
// (actors/supervisor.hpp), which moves the job through the rest of its lifecycle
// (engine/lifecycle.hpp). The phases in order:
//   resolving   the run's identity and start (engine/run_start.hpp), the layout, everything that can
//               refuse the run; then on_start, the in-memory snapshot folder, the sgemm peak.
//   starting    an attempt: a fresh actor system, the ranks spawned and loaded (run_ranks), then
//   training    the trainer driven to its end (drive_trainer);
//   stopping    the last saves flushed, reports gathered, the actors torn down; then finished.
//   recovering  a failed attempt (an actor that threw, a rank whose peer died, a failed save), up to
//               --max-restarts times: every actor anew from the newer of this run's latest checkpoint
//               in --save and its in-memory snapshot (from the start, or --load, when there is
//               neither); another run's checkpoint is never resumed. Then starting again.
//   failed      refused, or a failure that is not restarted.
Result<TrainSummary> run_training(const TrainConfig& config, std::shared_ptr<const DataSource> data,
                                  const JobCallbacks& callbacks, const JobOptions& options) {
  (void)training_started();
  JobLifecycle lifecycle(callbacks.on_phase);
  auto failed = [&](Status st) {
    lifecycle.enter(JobPhase::failed, st.message());
    return st;
  };
  auto note = [&](const std::string& s) {
    if (callbacks.on_note) callbacks.on_note(s);
  };
  // Where the run's time goes (engine/goodput.hpp), fed by every attempt's events.
  auto ledger = std::make_shared<GoodputLedger>(
      std::chrono::duration<double>(training_started().time_since_epoch()).count(), options.restarted);
  AttemptContext run;
  run.data = std::move(data);
  run.callbacks = counted_callbacks(callbacks, ledger, config.pipeline_model_parallel_size);
  run.options = &options;
  run.threads = resolve_threads(config.num_threads);
  run.lifecycle = &lifecycle;
  auto fault = nan_fault_from_env();  // TROUPE_FAULT_NAN (engine/fault_injection.hpp)
  if (!fault) return failed(fault.status());
  run.nan.fault = std::move(fault).value();
  run.nan.control = std::make_shared<NanControl>(config.watch_nan);

  // resolving. Everything that can refuse the run is checked before the caller's on_start, which
  // only a run that starts gets; the notes of these checks follow on_start (a caller may set up its
  // printing there), or go with the error of a refused run.
  std::vector<std::string> start_notes;
  auto refused = [&](Status st) {
    std::string notes;
    for (const std::string& n : start_notes) notes += "\n  note: " + n;
    const Status with = Status::error(st.message() + notes);
    return failed(st.is_bad_input() ? with.as_bad_input() : with);
  };
  TrainConfig attempt = config;
  // In-memory snapshots over several hosts: a copy of each shard on the next host
  // (engine/snapshot_copies.hpp), agreed on at the start before anything loads.
  std::unique_ptr<SnapshotCopies> copies;
  if (config.save_memory_interval > 0 && options.world && options.bootstrap != nullptr && options.world->size() > 1) {
    auto launch = comm::detect_launch_env();
    if (!launch) return refused(launch.status());
    if (launch->local_world_size != options.world->size()) {
      if (options.world->backend() != "ucx")
        return refused(Status::bad_input(
            "--save-memory-interval over several hosts copies each snapshot shard to another host over the job's UCX "
            "world, and this job's world is " + options.world->backend() +
            " (GPU buffers only) -- drop --save-memory-interval and use --save, or run on one host"));
      auto opened = SnapshotCopies::open(*options.bootstrap, *options.world, launch->node_rank, launch->local_rank);
      if (!opened) return refused(opened.status());
      copies = std::move(opened).value();
    }
  }
  run.copies = copies.get();
  if (Status st = resolve_run(attempt, options, [&](const std::string& s) { start_notes.push_back(s); }, copies.get());
      !st)
    return refused(st);
  if (Status st = plan_ranks(attempt, options, run.threads).status(); !st) return refused(st);
  if (!attempt.load.empty() && !is_hf_folder(attempt.load))
    if (Status st = plan_load(attempt).status(); !st) return refused(st);
  if (callbacks.on_start) {
    const int rank = options.bootstrap != nullptr ? options.bootstrap->rank() : 0;
    const int processes = options.world ? options.world->size() : 1;
    if (Status st = callbacks.on_start(attempt, *run.data, rank, processes); !st) return failed(st);
  }
  for (const std::string& s : start_notes) note(s);
  // In-memory snapshots: a folder on a tmpfs, of this process (gone when the run ends however it
  // ends) or, under troupe launch, of the launched run on this host (its restarted ranks resume from
  // it; the launcher removes it when it ends).
  MemorySnapshotFolder memory;
  if (config.save_memory_interval > 0)
    if (Status st = memory.open(config, options, copies.get(), note); !st) return refused(st);
  // Unfinished saves in --save (shards without metadata.json: a process killed while saving, or a
  // save that failed in another process) are debris this run's own saves would otherwise have to
  // find room beside: on a disk that is still full, the save of that iteration again could not. One
  // process removes them, before any step (no save of this run can be under way yet).
  if (!attempt.save.empty() && (options.bootstrap == nullptr || options.bootstrap->rank() == 0))
    discard_unfinished_saves(attempt.save, note);
  if (options.measure_peak) {
    auto peak = measure_job_peak(run.threads, options.bootstrap, note, options.local_peak);
    if (!peak) return failed(peak.status());
    run.peak = peak.value();
  }
  // What the process holds before its ranks allocate anything (binary, libraries, the actor system,
  // the sgemm measurement's thread buffers): the memory plan's figures come on top of it, and
  // bench/plan_validate.sh measures the peak against it.
  if (const double resident = resident_bytes_now(); resident > 0)
    note("resident before the ranks: " + std::to_string(static_cast<long long>(resident / (1024.0 * 1024.0))) +
         " MiB (the memory plan's figures come on top of it)");

  // starting, training, stopping, recovering: the supervisor actor (actors/supervisor.hpp) runs the
  // attempts and decides after each.
  SupervisorHooks hooks;
  hooks.attempt = [&](int) {
    AttemptOutcome out;
    out.result = run_attempt(attempt, run, &out.stuck);  // starting -> training -> stopping (when it succeeded)
    return out;
  };
  // The NaN watch stops the run (a restart would meet it again); the same bad input would be refused
  // again; a stuck rank's thread stays behind, so this process cannot restart cleanly (troupe launch
  // can); under troupe launch the launcher restarts the processes.
  hooks.may_restart = [&](const AttemptOutcome& out, int n) {
    const bool stopped = options.stop != nullptr && options.stop->load();
    if (run.nan.control->report() || stopped || out.stuck || n > config.max_restarts || options.world ||
        out.result.status().is_bad_input())
      return out.result.status();
    return Status::ok();
  };
  hooks.restart_from = [&](const AttemptOutcome& out, int n) -> Result<std::string> {
    note("the job failed: " + out.result.status().message());
    auto point = restart_point(config, attempt, memory.dir(), out.result.status());
    if (!point) return point.status();
    ledger->failed(steady_seconds(), point->found ? point->iteration : 0);
    note("restart " + std::to_string(n) + " of " + std::to_string(config.max_restarts) + ": every actor anew, from " +
         point->from);
    return point->from;
  };
  hooks.finished = [&](TrainSummary& summary) { summary.goodput = ledger->report(steady_seconds()); };
  return supervise(lifecycle, hooks);
}

Result<EvalSummary> run_evaluation(const std::string& dir, std::shared_ptr<const DataSource> data, int64_t samples,
                                   int micro_batch_size, int num_threads, std::shared_ptr<const Model> model) {
  auto it = latest_iteration(dir);
  if (!it) return it.status().as_bad_input();
  auto cfg = stored_config(dir, -1, model != nullptr, model == nullptr || has_gpt_blocks(*model));
  if (!cfg) return cfg.status().as_bad_input();
  // A model given in code, whatever layout it was trained on: its blocks in order on the one rank.
  std::shared_ptr<const Model> one;
  if (model) {
    TrainConfig job = cfg.value();
    job.tensor_model_parallel_size = job.pipeline_model_parallel_size = job.data_parallel_size = 1;
    job.context_parallel_size = 1;
    job.num_layers_per_virtual_pipeline_stage = 0;
    job.sequence_parallel = false;
    job.micro_batch_size = micro_batch_size;
    job.zero_stage = 0;
    job.device = "cpu";
    job.precision = PrecisionConfig{};
    auto flat = std::make_shared<Model>(single_stage(*model));
    if (Status st = check_model_for_job(*flat, job, 1); !st)
      return st.with_context("the model given to evaluate " + dir + ": ").as_bad_input();
    one = flat;
  }
  const int64_t terms = model && model->loss_terms_per_sample > 0 ? model->loss_terms_per_sample
                                                                   : cfg.value().model.seq_length;
  const int64_t available = data->num_windows(DataSplit::train);
  if (samples <= 0) samples = available;
  if (samples > available)
    return Status::bad_input("--eval-samples " + std::to_string(samples) + " exceeds the " + std::to_string(available) +
                         " windows of --seq-length + 1 tokens in the data -- pass at most " + std::to_string(available));
  if (samples == 0) return Status::bad_input("the data has no window of seq_length + 1 tokens -- use a larger dataset");

  // One rank (1x1x1) that only evaluates: no optimizer partition, the parameters of any layout's
  // checkpoint.
  RankSpec spec;
  spec.model = cfg.value().model;
  spec.micro_batch_size = micro_batch_size;
  spec.num_threads = resolve_threads(num_threads);
  spec.evaluation_only = true;
  spec.custom_model = one;
  caf::actor_system_config sys_cfg = make_system_config();
  caf::actor_system system{sys_cfg};
  auto local = spawn_ranks(system, spec, nullptr);
  if (!local) return local.status();
  const group_actor group = local->group;
  data_loader_actor loader = spawn_data_loader(system, data);
  caf::scoped_actor self{system};
  auto shutdown = [&] {
    local->exit(self.ptr());
    self->send_exit(loader, caf::exit_reason::user_shutdown);
  };
  LoadRequest req;
  req.dir = dir;
  req.iteration = it.value();
  req.load_optimizer = false;
  Status loaded = ask_ok(self, group, load_atom::value, req);
  if (!loaded) return shutdown(), loaded;

  EvalSummary out;
  out.iteration = it.value();
  double total = 0;
  Status failure;
  for (int64_t first = 0; first < samples && failure.is_ok(); first += micro_batch_size) {
    const int32_t count = static_cast<int32_t>(std::min<int64_t>(micro_batch_size, samples - first));
    self->request(loader, caf::infinite, batch_atom::value, DataSplit::train, first, count)
        .receive(
            [&](Tensor& batch) {
              self->request(group, caf::infinite, eval_atom::value, batch)
                  .receive([&](double loss_sum) { total += loss_sum; },
                           [&](caf::error& err) { failure = Status::error(describe(err)); });
            },
            [&](caf::error& err) { failure = Status::error(describe(err)); });
  }
  shutdown();
  if (!failure.is_ok()) return failure;
  out.samples = samples;
  out.tokens = samples * terms;  // loss terms: tokens for GPT's head, the model's own count otherwise
  out.loss = total / static_cast<double>(out.tokens);
  out.perplexity = std::exp(std::min(out.loss, 700.0));
  return out;
}

}  // namespace troupe
