// troupe::train, troupe::evaluate and troupe::open_data (include/troupe/train.hpp): the set-up that
// `troupe train` and `troupe eval` share with every program that embeds troupe -- the launch
// environment, the tokenizer's vocabulary, the memory check, the data, the rendezvous and UCX world
// of a multi-process job -- then the job of actors/job.hpp.
#include "troupe/train.hpp"

#include "api/setup.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string_view>
#include <thread>


#include "actors/job.hpp"
#include "comm/bootstrap/caf_bootstrap.hpp"
#include "comm/bootstrap/launch_env.hpp"
#include "comm/ucx/ucx_world.hpp"
#include "config/imported_config.hpp"
#include "config/layout_text.hpp"
#include "config/memory_estimate.hpp"
#include "config/validate.hpp"
#include "kernels/device_info.hpp"
#include "model/pipeline_model.hpp"
#ifdef TROUPE_WITH_CUDA
#include "comm/nccl/nccl_world.hpp"
#endif
#include "storage/tokenizer.hpp"

namespace troupe {

namespace {

// The default of RunOptions::on_peer_failure: a rank blocked on a dead peer's data fails by itself
// (comm/ reports it); one waiting for a hung peer would wait for ever, so the ordinary failure path
// gets `grace` (5 s, or half the heartbeat's timeout when that is shorter, so a short
// --distributed-timeout-minutes is kept end to end), then the process ends naming the cause. The
// latest checkpoint stays intact (it only moves once a save is complete), and troupe launch
// --max-restarts restarts from it.
void end_process_after_peer_failure(int rank, const std::string& why, std::chrono::milliseconds grace) {
  std::thread([rank, why, grace] {
    std::this_thread::sleep_for(grace);
    std::fprintf(stderr, "troupe train: error: rank %d: the job failed (%s) -- stopping this rank; restart the job "
                 "from its latest checkpoint (troupe launch --max-restarts N does it)\n", rank, why.c_str());
    std::fflush(stderr);
    std::_Exit(1);
  }).detach();
}

// How many attempts of troupe::train ended in this process (in-job recovery's watchdog below).
std::atomic<int> g_attempts_ended{0};
void attempt_ended() { g_attempts_ended.fetch_add(1); }

// Under in-job recovery the default of RunOptions::on_peer_failure: the attempt fails by itself
// (comm/ fails every operation with the lost peer, the bootstrap every request) and this process
// rejoins; only an attempt that has not ended `grace` x 6 (at least 30 s) later -- a rank blocked on
// a hung peer -- ends the process, which the launcher then replaces.
void recover_after_peer_failure(int rank, const std::string& why, std::chrono::milliseconds grace) {
  const int ended = g_attempts_ended.load();
  const auto wait = std::max(std::chrono::milliseconds(30'000), grace * 6);
  std::thread([rank, why, wait, ended] {
    std::this_thread::sleep_for(wait);
    if (g_attempts_ended.load() != ended) return;
    std::fprintf(stderr, "troupe train: error: rank %d: the job failed (%s) and this rank's attempt did not end "
                 "within %.0f s -- stopping this rank (the launcher starts it again)\n", rank, why.c_str(),
                 std::chrono::duration<double>(wait).count());
    std::fflush(stderr);
    std::_Exit(1);
  }).detach();
}

}  // namespace

InJobRecovery in_job_recovery_from_env(int world) {
  InJobRecovery r;
  const char* on = std::getenv("TROUPE_IN_JOB_RECOVERY");
  if (world <= 1 || on == nullptr || std::string(on) != "1") return r;
  const char* max = std::getenv("TORCHELASTIC_MAX_RESTARTS");
  r.max_recoveries = max != nullptr ? std::max(0, std::atoi(max)) : 0;
  r.enabled = r.max_recoveries > 0;
  const char* replacement = std::getenv("TROUPE_REPLACEMENT");
  r.replacement = r.enabled && replacement != nullptr && std::string(replacement) == "1";
  const char* spares = std::getenv("TROUPE_IN_JOB_SPARES");
  r.spares = r.enabled && spares != nullptr && std::string(spares) == "1";
  return r;
}

namespace {
constexpr std::string_view kGivenUpText = "the job was given up: ";
}  // namespace

bool job_given_up(const Status& st) {
  return !st.is_ok() && st.message().find(kGivenUpText) != std::string::npos;
}

Status resolve_config(TrainConfig& cfg, int world, int local_world, const GivenToRun& given) {
  GivenInCode in_code;
  in_code.data = given.data;
  in_code.model_without_gpt_layers = given.model != nullptr && !has_gpt_blocks(*given.model);
  // --load of a Hugging Face folder by a config that names no tokenizer: the folder's own.
  if (auto taken = take_hf_folder_tokenizer(cfg); !taken) return taken.status().as_bad_input();
  if (Status st = validate_train_config(cfg, nullptr, in_code, std::max(1, world)); !st) return st.as_bad_input();
  if (world > 1)
    if (Status st = validate_world(cfg, world); !st) return st.as_bad_input();
  if (cfg.device == "cuda") {
    const DeviceInfo d = query_devices();
    if (d.cuda_devices < 1)
      return Status::bad_input("--device cuda, but this troupe has no usable GPU (" +
                               std::string(d.cuda_built ? "" : "CUDA backend not built; ") + d.cuda_detail +
                               ") -- run on a machine with an NVIDIA GPU and its driver, or use --device cpu");
  }
  // Restarts of a multi-process job are the launcher's (every process anew); a restarted process
  // resumes from the latest checkpoint in --save.
  if (world > 1 && cfg.max_restarts > 0)
    return Status::bad_input("--max-restarts " + std::to_string(cfg.max_restarts) +
                             " restarts the actors of one process, but this job has " + std::to_string(world) +
                             " -- pass --max-restarts to troupe launch, which restarts every process");
  auto tokenizer = make_tokenizer(cfg.tokenizer_type, cfg.vocab_file, cfg.merge_file, cfg.tokenizer_model);
  if (!tokenizer) return tokenizer.status().as_bad_input();
  cfg.model.vocab_size = tokenizer.value()->vocab_size();
  if (!in_code.model_without_gpt_layers)
    if (Status st = cfg.model.validate(); !st) return st.as_bad_input();
  // A model given in code: checked against the job here already, for its memory estimate.
  std::vector<StageFootprint> footprint;
  if (given.model != nullptr) TROUPE_RETURN_IF_ERROR(check_model_for_job(*given.model, cfg, world, &footprint));
  // Before anything is allocated: a configuration that cannot fit is refused naming the flag to lower.
  if (Status st = check_memory(cfg, world, local_world, available_memory_bytes(), given.model ? &footprint : nullptr); !st)
    return st.as_bad_input();
  // Mixture of experts is read and checked, but not trained yet (config/validate.hpp): delete with it.
  return Status::ok();
}

Result<std::shared_ptr<DataSource>> open_data(const TrainConfig& cfg) {
  if (cfg.model.vocab_size <= 0)
    return Status::bad_input("open_data: config.model.vocab_size is " + std::to_string(cfg.model.vocab_size) +
                             " -- set it to the tokenizer's vocabulary first (troupe::train does so itself; for "
                             "the byte-level tokenizer it is 257)");
  if (cfg.mock_data) return make_mock_data(cfg.model.vocab_size, cfg.model.seq_length, cfg.seed);
  DataPaths paths{cfg.data_path, cfg.train_data_path, cfg.valid_data_path, cfg.test_data_path};
  auto data = open_blended_data(paths, cfg.split, cfg.model.seq_length, cfg.seed, cfg.no_shuffle,
                                cfg.model.vocab_size);
  if (!data) {
    // One dataset: its messages name the prefix, as before blends; a blend's name their flag.
    const bool single = cfg.data_path.size() == 1 && cfg.data_path[0].find_first_of(" \t\n") == std::string::npos;
    return (single ? data.status().with_context("--data-path " + cfg.data_path[0] + ": ") : data.status())
        .as_bad_input();
  }
  return data;
}

namespace {

// RunOptions::choose_layout over the job: rank 0 chooses, every rank takes its choice (or its error).
Status agree_on_layout(TrainConfig& cfg, comm::Bootstrap& bootstrap, const RunOptions& run, int local_world) {
  std::string mine;
  if (bootstrap.rank() == 0) {
    auto chosen = run.choose_layout(cfg, bootstrap.world_size(), local_world);
    mine = chosen ? "ok\n" + layout_text(chosen.value())
                  : std::string(chosen.status().is_bad_input() ? "bad\n" : "error\n") + chosen.status().message();
  }
  auto all = bootstrap.all_gather("auto-layout", mine);
  if (!all) return all.status();
  const std::string& sent = all.value().front();
  const size_t eol = sent.find('\n');
  const std::string head = sent.substr(0, eol), body = eol == std::string::npos ? "" : sent.substr(eol + 1);
  if (head == "bad") return Status::bad_input(body);
  if (head != "ok") return Status::error(head == "error" ? body : "auto-layout: rank 0 sent no layout");
  return apply_layout_text(body, cfg);
}

}  // namespace

namespace {

// A launched process's link to the job: the rendezvous and the communication world of one
// generation. In-job recovery closes it after a failure and opens the next generation's.
class JobLink {
 public:
  JobLink(const comm::LaunchEnv& env, const RunOptions& run, const InJobRecovery& recovery)
      : env_(env), run_(run), recovery_(recovery), slot_(std::make_shared<WorldSlot>()) {
    // With warm spares the rendezvous moves when its host is lost (comm/bootstrap/rendezvous_place.hpp):
    // this node's processes keep where it is in the launcher's hint file, and a process started
    // later (a replacement, a spare) looks there first.
    const char* hint = std::getenv("TROUPE_RDZV_HINT");
    if (!recovery_.spares || hint == nullptr || *hint == '\0') return;
    hint_path_ = hint;
    if (!recovery_.replacement && !env_.spare) return;
    auto read = comm::read_hint(hint_path_);
    if (!read) {
      std::fprintf(stderr, "troupe train: warning: %s -- looking for the rendezvous at MASTER_ADDR only\n",
                   read.status().message().c_str());
      std::fflush(stderr);
    } else if (read.value()) {
      at_ = read.value()->at;
      standby_ = read.value()->standby;
    }
  }

  comm::CafBootstrap* bootstrap() const { return bootstrap_.get(); }
  // A fresh process's hint names a standby: the job's first rendezvous completed, and a lost rank 0
  // (whose rendezvous went with it) is replaced by a spare where the standby hosts the next.
  bool rendezvous_may_have_moved() const { return at_.has_value() && standby_.has_value(); }

  // Joins this generation's rendezvous (once; later calls do nothing). Under in-job recovery
  // *generation is the one this process joins as, and becomes the newest any process brought
  // (replacements bring none); *job_run, the run the job decided at an earlier generation ("" before
  // the first), becomes the lowest rank's that knows it (a spare in rank 0's place learns it here).
  Status meet(const TrainConfig& cfg, int32_t* generation, std::string* job_run) {
    if (bootstrap_) return Status::ok();
    // A peer that stops answering (hung, or its host cut off) is noticed within the heartbeat's
    // connection timeout: 15 s, or a third of --distributed-timeout-minutes when that is shorter,
    // at least 2 s; by default the process then ends 5 s later, or half that timeout later when
    // that is shorter: two thirds of the timeout at most, the rest is slack for a loaded host.
    options_ = comm::CafBootstrapOptions{};
    const auto third_timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.distributed_timeout_minutes * 20'000));
    if (third_timeout < options_.connection_timeout) {
      options_.connection_timeout = std::max(third_timeout, std::chrono::milliseconds(2000));
      options_.heartbeat_interval = options_.connection_timeout / 5;
    }
    const auto grace = std::min(std::chrono::milliseconds(5000),
                                std::chrono::duration_cast<std::chrono::milliseconds>(options_.connection_timeout / 2));
    std::function<void(int, const std::string&)> on_peer_failure = run_.on_peer_failure;
    if (!on_peer_failure && recovery_.enabled)
      on_peer_failure = [grace, slot = slot_](int rank, const std::string& why) {
        {
          std::lock_guard<std::mutex> lock(slot->mu);
          if (slot->world) slot->world->abort("the job failed: " + why);
        }
        recover_after_peer_failure(rank, why, grace);
      };
    if (!on_peer_failure)
      on_peer_failure = [grace](int rank, const std::string& why) { end_process_after_peer_failure(rank, why, grace); };
    options_.on_job_failed = [&env = env_, on_peer_failure](const std::string& why) { on_peer_failure(env.rank, why); };
    options_.in_job_recovery = recovery_.enabled;
    options_.open_places = open_places_;
    if (recovery_.enabled) options_.attempt = *generation;
    if (recovery_.spares) place_rendezvous();
    auto b = comm::create_caf_bootstrap(env_, options_);
    if (!b) return b.status();  // an unusable MASTER_ADDR is bad input
    bootstrap_ = std::move(b).value();
    if (recovery_.enabled) {
      auto all = bootstrap_->all_gather("generation", std::to_string(*generation) + " " + *job_run);
      if (!all) return all.status();
      std::string known;
      for (const std::string& g : all.value()) {
        *generation = std::max(*generation, static_cast<int32_t>(std::atoi(g.c_str())));
        const size_t space = g.find(' ');
        const std::string run = space == std::string::npos ? "" : g.substr(space + 1);
        const bool hex = run.size() <= 64 && std::all_of(run.begin(), run.end(), [](char c) {
          return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
        });
        if (known.empty() && hex) known = run;
      }
      *generation = std::max<int32_t>(*generation, 0);
      if (!known.empty()) *job_run = known;
      // Every rank has joined: the rendezvous named its standby before this gather's answer.
      at_ = bootstrap_->place();
      standby_ = bootstrap_->standby();
    }
    return Status::ok();
  }

  // Builds the world over the rendezvous (NCCL for --device cuda, one GPU per process; UCX for CPU
  // ranks) into options.
  Status open_world(const TrainConfig& cfg, JobOptions& options) {
    Result<std::unique_ptr<comm::CommWorld>> w = Status::error("no world");
    if (cfg.device == "cuda") {
#ifdef TROUPE_WITH_CUDA
      comm::NcclOptions nccl;
      nccl.init_timeout = options_.connection_timeout * 4;
      nccl.op_timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.distributed_timeout_minutes * 60'000));
      w = comm::create_nccl_world(*bootstrap_, env_.local_rank, nccl);
      options.cuda_device = env_.local_rank;
#else
      return Status::bad_input("--device cuda: this troupe was built without the CUDA backend");
#endif
    } else {
      w = comm::create_ucx_world(*bootstrap_);
    }
    if (!w) return w.status().with_context("rank " + std::to_string(env_.rank) + ": ");
    world_ = std::shared_ptr<comm::CommWorld>(std::move(w).value());
    {
      std::lock_guard<std::mutex> lock(slot_->mu);
      slot_->world = world_;
    }
    // A failure reported while the world was being built: give it up at once.
    if (recovery_.enabled && !bootstrap_->job_failure().empty()) world_->abort(bootstrap_->job_failure());
    options.world = world_;
    options.bootstrap = bootstrap_.get();
    return Status::ok();
  }

  // The rendezvous's host: tells the spares waiting for a place that the job ended (CafBootstrap::end_job).
  void end_job(const std::string& outcome) {
    if (bootstrap_ && bootstrap_->hosts_rendezvous()) bootstrap_->end_job(outcome);
  }

  // Gives the generation up (the attempt over it has ended): the world, then the rendezvous. Rank 0
  // keeps the ranks it lost: a spare may take their places at the next generation.
  void close() {
    {
      std::lock_guard<std::mutex> lock(slot_->mu);
      slot_->world.reset();
    }
    world_.reset();
    if (bootstrap_) {
      bootstrap_->close();
      open_places_ = bootstrap_->hosts_rendezvous() ? bootstrap_->lost_ranks() : std::vector<int>{};
      lost_rendezvous_ = bootstrap_->rendezvous_lost();
      if (auto standby = bootstrap_->standby()) standby_ = standby;
    }
    bootstrap_.reset();
  }

 private:
  // Where this generation's rendezvous is: where the last one was, or -- that one lost -- its
  // standby's place, which the standby's process hosts (the lost rendezvous's rank opens to spares
  // at once, any other place not taken after CafBootstrapOptions::moved_spare_grace); a standby whose generation failed otherwise hosts there when nothing else answers.
  void place_rendezvous() {
    options_.failover_after = options_.connection_timeout;
    if (!hint_path_.empty())
      options_.on_standby = [path = hint_path_](const comm::RendezvousPlace& at, const comm::RendezvousPlace& standby) {
        (void)comm::write_hint(path, comm::RendezvousHint{at, standby});
      };
    if (!at_) return;
    const bool moved = lost_rendezvous_ && standby_.has_value();
    options_.rendezvous_at = moved ? *standby_ : *at_;
    options_.rendezvous_moved = moved;
    if (moved)
      options_.places = {*at_};
    else if (standby_)
      options_.places = {*standby_};
    const bool standby_here = !env_.spare && standby_ && standby_->rank == env_.rank;
    if (moved && standby_here) options_.open_places = {at_->rank};
    if (!moved && standby_here) options_.standby_here = standby_;
  }

  // The world a job failure reported by the bootstrap gives up (CommWorld::abort, in-job recovery:
  // the attempt's ranks stop waiting on peers that moved on); cleared before the world goes.
  struct WorldSlot {
    std::mutex mu;
    std::shared_ptr<comm::CommWorld> world;
  };
  const comm::LaunchEnv& env_;  // a spare's rank is the one its join got (train() sets it)
  const RunOptions& run_;
  const InJobRecovery recovery_;
  std::vector<int> open_places_;
  // The rendezvous's place and standby as last learned, and whether the last generation lost it.
  std::optional<comm::RendezvousPlace> at_, standby_;
  bool lost_rendezvous_ = false;
  std::string hint_path_;  // TROUPE_RDZV_HINT: this node's hint file ("" without warm spares)
  std::shared_ptr<WorldSlot> slot_;
  comm::CafBootstrapOptions options_;
  std::unique_ptr<comm::CafBootstrap> bootstrap_;
  std::shared_ptr<comm::CommWorld> world_;
};

// What a spare the job never needed returns: a summary saying so when the job finished, the job's
// end otherwise (given up: exit 76 as the ranks', so its launcher restarts nothing).
Result<TrainSummary> spare_outcome(const Status& ended) {
  const std::string& text = ended.message();
  const size_t at = text.find(comm::kJobEndedText);
  const std::string outcome = at == std::string::npos ? text : text.substr(at + std::string(comm::kJobEndedText).size());
  if (outcome == "finished") {
    TrainSummary s;
    s.spare_unused = true;
    return s;
  }
  return Status::error("the job this spare waited for ended: " + outcome);
}

}  // namespace

Result<TrainSummary> train(TrainConfig cfg, std::shared_ptr<const DataSource> data, const TrainCallbacks& callbacks,
                           const RunOptions& run) {
  // Under troupe launch (or srun / mpirun) every process holds one rank; the ranks started decide
  // the data-parallel size when it is left at 0.
  auto env = comm::detect_launch_env();
  if (!env) return env.status().as_bad_input();
  const int world = env->world_size;
  // A process troupe launch restarted resumes this run's latest checkpoint in --save (run_training
  // decides, config/run_identity.hpp); the launcher names the run in TROUPE_RUN_ID.
  const char* restart_count = std::getenv("TROUPE_RESTART_COUNT");
  const bool restarted = restart_count != nullptr && std::atoi(restart_count) > 0;
  // troupe launch --in-job-recovery (docs/RESILIENCE.md, "In-job recovery"): this process outlives a
  // failure of another and rejoins the job as its next generation, up to the launch's --max-restarts
  // times, keeping the data and its measured sgemm peak (a replacement does not measure it: the
  // others wait for it).
  const InJobRecovery recovery = in_job_recovery_from_env(world);
  if (env->spare && !recovery.spares)
    return Status::bad_input("this process was started as a spare (TROUPE_SPARE=1) outside a job with spares -- "
                             "troupe launch --in-job-recovery --max-restarts N --spares K starts spares");
  const TrainConfig given = cfg;
  const bool data_given = data != nullptr;  // the caller's (not the data a recovered attempt keeps)
  // A replacement or spare does not measure the sgemm peak (the others would wait for it).
  double local_peak = recovery.replacement || env->spare ? -1 : 0;
  int32_t generation =
      recovery.replacement || env->spare ? comm::kAnyGeneration : (restarted ? std::atoi(restart_count) : 0);
  bool took_a_place = false;  // a spare that joined the job in a lost rank's place
  std::string job_run;        // the run the job decided (in-job recovery: learned at each rendezvous)
  // An elastic round's launcher names the job's run (its host's may have moved to another launcher).
  if (const char* id = std::getenv("TROUPE_JOB_RUN_ID"); id != nullptr && std::strlen(id) == 32 &&
      std::all_of(id, id + 32, [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }))
    job_run = id;
  JobLink link(*env, run, recovery);
  // A replacement of rank 0 after the job's first rendezvous: that rendezvous, rank 0's, went with
  // its process, and the standby hosts the next one, where this process is a spare like any other.
  if (recovery.replacement && recovery.spares && env->rank == 0 && link.rendezvous_may_have_moved()) {
    std::fprintf(stderr, "troupe train: rank 0's process was lost and its rendezvous with it; this replacement "
                         "joins the job as a spare (the standby hosts the rendezvous now)\n");
    std::fflush(stderr);
    env->spare = true;
    env->rank = -1;
  }
  // Joins this generation; a spare waits there for a place (the job may end first: a spare it never
  // needed ends well), a rank whose place a spare took while it was cut off stays as a spare.
  enum class Met { joined, as_spare, ended };
  Status spare_end = Status::ok();
  auto meet = [&](const TrainConfig& c) -> Result<Met> {
    const bool spare = env->spare;
    Status st = link.meet(c, &generation, &job_run);
    if (st && spare) {
      env->spare = false;
      env->rank = link.bootstrap()->rank();
      took_a_place = true;
      std::fprintf(stderr, "troupe train: a spare takes the place of rank %d in the job (generation %d)\n", env->rank,
                   generation);
      std::fflush(stderr);
    }
    if (st) return Met::joined;
    if (spare && comm::job_ended_for_spare(st)) {
      spare_end = st;
      return Met::ended;
    }
    if (recovery.spares && !spare && comm::place_taken_by_spare(st)) {
      std::fprintf(stderr, "troupe train: %s -- this process stays as a spare of the job\n", st.message().c_str());
      std::fflush(stderr);
      env->spare = true;
      env->rank = -1;
      generation = comm::kAnyGeneration;
      link.close();
      return Met::as_spare;
    }
    return st;
  };
  for (int recovered = 0;; ++recovered) {
    cfg = given;
    // The ranks meet at the rendezvous and build the world before anything is reported; with a
    // layout to choose they meet first, and rank 0's choice is every rank's config.
    if (world > 1 && run.choose_layout) {
      auto met = meet(cfg);
      if (!met) return met.status();
      if (met.value() == Met::as_spare) continue;
      if (met.value() == Met::ended) return spare_outcome(spare_end);
      TROUPE_RETURN_IF_ERROR(agree_on_layout(cfg, *link.bootstrap(), run, env->local_world_size));
    }
    TROUPE_RETURN_IF_ERROR(resolve_config(cfg, world, env->local_world_size, GivenToRun{data_given, run.model.get()}));
    if (!data) {
      auto opened = open_data(cfg);
      if (!opened) return opened.status();
      data = std::move(opened).value();
    }
    JobOptions options;
    if (world > 1) {
      auto met = meet(cfg);
      if (!met) return met.status();
      if (met.value() == Met::as_spare) continue;
      if (met.value() == Met::ended) return spare_outcome(spare_end);
      TROUPE_RETURN_IF_ERROR(link.open_world(cfg, options));
    }
    // Ranks sharing a host share its cores: by default each takes its share.
    if (cfg.num_threads == 0 && env->local_world_size > 1)
      cfg.num_threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / env->local_world_size);
    options.stop = run.stop;
    options.regroup = run.regroup;
    options.measure_peak = run.measure_peak;
    options.local_peak = &local_peak;
    options.schedule = run.schedule;
    options.model = run.model;
    options.job_token = env->token;
    options.on_stuck = run.on_stuck;
    options.restarted = restarted || recovered > 0 || took_a_place;
    if (const char* id = std::getenv("TROUPE_RUN_ID")) options.launch_run_id = id;
    options.job_run_id = job_run;
    options.run_id_out = &job_run;
    auto result = run_training(cfg, data, callbacks, options);
    attempt_ended();
    const bool stopping = run.stop != nullptr && run.stop->load();
    if (!recovery.enabled || result || result.status().is_bad_input() || stopping) {
      // Rank 0 tells the spares still waiting how the job ended.
      link.end_job(result ? "finished" : stopping ? "stopped" : "failed: " + result.status().message());
      return result;
    }
    // The job's recoveries, not this process's: a replacement took the job's generation at its
    // rendezvous, so every process of the job gives up at this same failure.
    if (generation >= recovery.max_recoveries) {
      const Status given_up =
          Status::error(std::string(kGivenUpText) + "it failed again after " + std::to_string(generation) +
                        " recovery(ies) in the job, the launch's --max-restarts: " + result.status().message());
      link.end_job(given_up.message());
      return given_up;
    }
    // Every process says it (on stderr, as the failure path without recovery does): rank 0 may be
    // the one that was lost.
    std::fprintf(stderr, "troupe train: rank %d: the job failed (%s) -- recovering in the job (%d of %d): this process "
                 "stays and rejoins as generation %d\n", env->rank, result.status().message().c_str(), generation + 1,
                 recovery.max_recoveries, generation + 1);
    std::fflush(stderr);
    options.world.reset();
    link.close();
    ++generation;
  }
}

Result<EvalSummary> evaluate(const std::string& dir, std::shared_ptr<const DataSource> data, int64_t samples,
                             int micro_batch_size, int num_threads, std::shared_ptr<const Model> model) {
  return run_evaluation(dir, std::move(data), samples, micro_batch_size, num_threads, std::move(model));
}

}  // namespace troupe
