// engine/run_start.hpp.
#include "engine/run_start.hpp"

#include <algorithm>
#include <filesystem>
#include <string>

#include <linux/magic.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "config/imported_config.hpp"
#include "kernels/peak.hpp"
#include "kernels/thread_pool.hpp"
#include "engine/snapshot_copies.hpp"
#include "storage/hf_import.hpp"
#include "storage/sharded_checkpoint.hpp"

namespace troupe {

std::string job_memory_snapshot_dir(const TrainConfig& config, const JobOptions& options) {
  return memory_snapshot_dir(config.save_memory_dir,
                             options.launch_run_id.empty() ? std::to_string(::getpid()) : options.launch_run_id);
}

namespace {
// The run a job without --load resumes: the one it decided at an earlier generation, else the launcher's.
const std::string& launch_run(const JobOptions& options) {
  return options.job_run_id.empty() ? options.launch_run_id : options.job_run_id;
}
}  // namespace

Status resolve_run(TrainConfig& config, const JobOptions& options, const NoteFn& note, SnapshotCopies* copies) {
  std::string loaded_id;
  // A fine-tune is a new run: it inherits no id from what it loads (a Hugging Face folder has none).
  if (!config.load.empty() && is_hf_folder(config.load)) config.finetune = true;
  const bool new_run = config.load.empty() || config.finetune;
  if (!new_run) {
    auto from = latest_run(config.load);
    if (!from) return from.status();
    loaded_id = from->run_id;
  }
  // The snapshots of a job over several hosts: every process reports what its host holds, restarted
  // or not (a replaced host's processes are new), and rank 0's decision holds.
  const bool collective = copies != nullptr && config.save_memory_interval > 0;
  bool from_memory = false;
  if ((options.restarted || collective) && (!config.save.empty() || config.save_memory_interval > 0)) {
    LatestRun latest;
    if (!config.save.empty()) {
      auto on_disk = latest_run(config.save);
      if (!on_disk) return on_disk.status();
      latest = std::move(on_disk).value();
    }
    const std::string expected = !new_run ? loaded_id : launch_run(options);
    const bool ours = latest.found && !expected.empty() && latest.run_id == expected;
    // This run's in-memory snapshot (the launcher's restarts share its folder), when it is newer.
    std::string memory;
    int64_t snapshot = -1;
    if (config.save_memory_interval > 0) {
      memory = job_memory_snapshot_dir(config, options);
      if (collective) {
        SnapshotReport mine;
        mine.restarted = options.restarted;
        mine.expected_run = expected;
        mine.disk_latest = ours ? latest.iteration : -1;
        mine.held = held_iterations(memory);
        auto got = copies->recover(memory, mine);
        if (!got) return got.status();
        snapshot = got->iteration;
        if (snapshot >= 0) note(got->note);
      } else {
        auto in_memory = latest_run(memory);
        if (in_memory && in_memory->found && !expected.empty() && in_memory->run_id == expected &&
            (!ours || in_memory->iteration > latest.iteration))
          snapshot = in_memory->iteration;
      }
    }
    if (!options.restarted) {
      // Not restarted itself: rank 0's decision, gathered below, says where it starts.
    } else if (snapshot >= 0) {
      from_memory = true;
      config.load = memory;
      config.finetune = config.no_load_optim = false;
      loaded_id = expected;
      note("restarted: resuming this run's in-memory snapshot of iteration " + std::to_string(snapshot) + " (" + memory +
           ")");
    } else if (ours) {
      config.load = config.save;  // this run's own checkpoint, resumed whole
      config.finetune = config.no_load_optim = false;
      loaded_id = expected;
      note("restarted: resuming this run's latest checkpoint, " + iteration_dir(config.save, latest.iteration));
    } else if (latest.found) {
      note("restarted: the latest checkpoint in " + config.save + " is not this run's (run id " +
           (latest.run_id.empty() ? std::string("none") : latest.run_id) + "): not resuming it");
    }
    if (options.restarted && snapshot < 0 && !ours)
      note(std::string("restarted: resuming this run's start, iteration 0: nothing of it is saved yet") +
           (collective ? " (no in-memory snapshot is whole over the hosts)" : ""));
  }
  std::string run_id = !loaded_id.empty()               ? loaded_id
                       : !new_run                        ? new_run_id()  // a checkpoint from before run ids
                       : !launch_run(options).empty()   ? launch_run(options)
                                                        : new_run_id();
  if (options.bootstrap != nullptr && options.bootstrap->world_size() > 1) {
    auto all = options.bootstrap->all_gather("run identity", run_id + "\n" + (config.finetune ? "F" : "R") +
                                                                 (config.no_load_optim ? "O" : "-") +
                                                                 (from_memory ? "M" : "-") + config.load);
    if (!all) return all.status();
    const std::string& decided = all.value().front();
    const size_t cut = decided.find('\n');
    run_id = decided.substr(0, cut);
    const std::string rest = cut == std::string::npos ? "" : decided.substr(cut + 1);
    config.finetune = rest.size() >= 3 && rest[0] == 'F';
    config.no_load_optim = rest.size() >= 3 && rest[1] == 'O';
    // An in-memory snapshot: each process loads its own host's folder (which the recovery completed).
    const bool memory = rest.size() >= 3 && rest[2] == 'M';
    config.load = memory ? job_memory_snapshot_dir(config, options) : rest.size() >= 3 ? rest.substr(3) : "";
  }
  config.run_id = run_id;
  if (options.run_id_out != nullptr) *options.run_id_out = run_id;
  return config.save.empty() ? Status::ok()
                             : check_save_folder(config.save, run_id, config.finetune ? "" : config.load);
}

Result<LoadPlan> plan_load(const TrainConfig& config) {
  LoadPlan plan;
  auto it = latest_iteration(config.load);
  if (!it) return it.status().as_bad_input();
  plan.iteration = it.value();
  auto meta = read_checkpoint_meta(config.load, plan.iteration);
  if (!meta) return meta.status().as_bad_input();
  plan.meta = std::move(meta).value();
  auto saved = TrainConfig::from_json(plan.meta.config_json);
  if (!saved)
    return saved.status().with_context("the config stored in " + iteration_dir(config.load, plan.iteration) + ": ").as_bad_input();
  plan.saved = std::move(saved).value();
  plan.resume = config.finetune ? check_finetune(config, plan.saved) : check_resume(config, plan.saved);
  TROUPE_RETURN_IF_ERROR(plan.resume.status(config.load, config.finetune));
  return plan;
}

Result<ResumePoint> resume_point(const TrainConfig& config, const LoadPlan& plan) {
  ResumePoint r;
  if (!plan.resume.changed.empty()) {
    std::string list;
    for (const std::string& c : plan.resume.changed) list += (list.empty() ? "" : ", ") + c;
    r.before.push_back((config.finetune ? "fine-tuning with changes: " : "resuming with changes: ") + list);
  }
  r.request.dir = config.load;
  r.request.iteration = plan.iteration;
  r.request.load_optimizer = !config.finetune && !config.no_load_optim;
  const TrainConfig& s = plan.saved;
  const std::string from = "loaded " + iteration_dir(config.load, plan.iteration) + " (saved by tp " +
                           std::to_string(s.tensor_model_parallel_size) + ", pp " +
                           std::to_string(s.pipeline_model_parallel_size) + ", ZeRO " + std::to_string(s.zero_stage) + ")";
  if (config.finetune) {
    r.loaded = from + ": its parameters only (--finetune): a new run from iteration 0 with fresh optimizer state";
    return r;
  }
  r.start_iteration = plan.meta.iteration;
  r.consumed_samples = plan.meta.consumed_samples;
  // Saves record the Adam steps the moments hold (equal to the iteration unless a --no-load-optim
  // load restarted them).
  // fp16's loss scaling (actors/trainer.cpp's loss_scaling_json): the steps overflows skipped are
  // neither in the schedule nor in Adam's step count; the scaler goes on where it was.
  const auto rng = nlohmann::json::parse(plan.meta.rng_json, nullptr, false);
  if (rng.is_object() && rng.contains("skipped_steps") && rng["skipped_steps"].is_number_integer() &&
      rng.contains("skipped_samples") && rng["skipped_samples"].is_number_integer()) {
    r.skipped_steps = std::clamp<int64_t>(rng["skipped_steps"].get<int64_t>(), 0, r.start_iteration);
    r.skipped_samples = std::clamp<int64_t>(rng["skipped_samples"].get<int64_t>(), 0, r.consumed_samples);
  }
  if (rng.is_object() && rng.contains("loss_scaler") && rng["loss_scaler"].is_array() &&
      config.precision.dtype == PrecisionDType::fp16) {
    std::vector<double> v;
    for (const auto& x : rng["loss_scaler"])
      if (x.is_number()) v.push_back(x.get<double>());
    auto state = LossScalerState::from_vector(v);
    if (!state)
      return state.status().with_context("the loss scaler's state in " + iteration_dir(config.load, plan.iteration) + ": ").as_bad_input();
    r.loss_scaler_state = state.value();
  }
  r.optimizer_step_offset =
      config.no_load_optim ? r.start_iteration - r.skipped_steps
                           : std::max<int64_t>(0, r.start_iteration - r.skipped_steps - plan.meta.optimizer_step);
  r.loaded = from + ": iteration " + std::to_string(r.start_iteration) + ", " + std::to_string(r.consumed_samples) +
             " samples consumed" + (config.no_load_optim ? "; the Adam moments start afresh (--no-load-optim)" : "");
  return r;
}

StagedHfFolder::~StagedHfFolder() {
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

LoadRequest StagedHfFolder::request() const {
  LoadRequest req;
  req.dir = dir_;
  req.iteration = 0;
  req.load_optimizer = false;
  return req;
}

std::string StagedHfFolder::loaded_note(const TrainConfig& config) const {
  std::string changes;
  for (const std::string& c : check_.changed) changes += "; changed: " + c;
  return "fine-tuning from the Hugging Face folder " + config.load +
         ": its weights, iteration 0, fresh optimizer state and schedule" + changes;
}

Result<std::unique_ptr<StagedHfFolder>> stage_hf_folder(const TrainConfig& config) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path tmp = fs::temp_directory_path(ec) / ("troupe-hf-" + std::to_string(::getpid()) + "-" + new_run_id());
  auto model = read_hf_folder(config.load);  // the tensors live only until they are staged
  if (!model) return model.status();
  const TrainConfig imported = imported_train_config(*model);
  ResumeCheck check = check_finetune(config, imported);
  TROUPE_RETURN_IF_ERROR(check.status(config.load, /*finetune=*/true));
  auto staged = std::make_unique<StagedHfFolder>(tmp.string(), std::move(check));
  CheckpointMeta meta;
  meta.config_json = imported.to_json();
  TROUPE_RETURN_IF_ERROR(write_hf_checkpoint(*model, tmp.string(), meta)
                             .with_context("staging the Hugging Face weights in " + tmp.string() + " (set TMPDIR elsewhere): "));
  return staged;
}

void discard_unfinished_saves(const std::string& save, const NoteFn& note) {
  auto latest = latest_run(save);
  const int64_t complete = latest && latest->found ? latest->iteration : -1;
  for (int64_t it : unfinished_saves(save, complete)) {
    const std::string dir = iteration_dir(save, it);
    const double bytes = static_cast<double>(directory_bytes(dir));
    discard_unfinished_save(dir);
    note("removed the unfinished save " + dir + " (shards without metadata.json, " +
         std::to_string(static_cast<int64_t>(bytes / 1024)) + " KiB): debris of a save that never completed, "
         "whose space this run's saves need");
  }
}

MemorySnapshotFolder::~MemorySnapshotFolder() {
  std::error_code ec;
  if (owned_) std::filesystem::remove_all(dir_, ec);
}

Status MemorySnapshotFolder::open(const TrainConfig& config, const JobOptions& options, const SnapshotCopies* copies,
                                  const NoteFn& note) {
  dir_ = job_memory_snapshot_dir(config, options);
  owned_ = options.launch_run_id.empty();
  std::error_code ec;
  if (owned_) std::filesystem::remove_all(dir_, ec);  // a folder of an earlier process with this pid
  std::filesystem::create_directories(dir_, ec);
  if (ec)
    return Status::bad_input("--save-memory-dir: cannot create " + dir_ + " (" + ec.message() +
                             ") -- give a writable directory on a tmpfs");
  // This process removes its own folder at its end (under troupe launch the launcher, which owns it);
  // folders whose owner was killed before it could are removed here.
  // (The launcher swept when it made a launched run's folder.)
  if (owned_) {
    TROUPE_RETURN_IF_ERROR(write_snapshot_owner(dir_, ::getpid()));
    for (const std::string& gone : sweep_abandoned_snapshot_folders(dir_))
      note("removed " + gone + ": the in-memory snapshots of a process that is gone (killed before it could)");
  }
  // On a disk every snapshot is synced like a save: its cost and, on a busy disk, stalls of seconds.
  if (struct statfs fs {}; ::statfs(dir_.c_str(), &fs) == 0 && fs.f_type != TMPFS_MAGIC && fs.f_type != RAMFS_MAGIC)
    note("the in-memory snapshots' folder " + dir_ + " is not on a tmpfs: each in-memory snapshot is written to "
         "its disk and synced, as a save is (slower; a busy disk can stall it for seconds) -- give a folder of "
         "/dev/shm or another tmpfs");
  // A snapshot a killed process left unfinished is debris its iteration's next snapshot would meet.
  if (copies != nullptr ? copies->first_of_host() : options.bootstrap == nullptr || options.bootstrap->rank() == 0)
    discard_unfinished_saves(dir_, note);
  if (copies != nullptr)
    note("in-memory snapshots every " + std::to_string(config.save_memory_interval) + " iterations in " + dir_ +
         " on this host, each shard copied to a process of the next of the job's " + std::to_string(copies->hosts()) +
         " hosts (a restart resumes from the newest snapshot whole over the hosts, or save)");
  else
    note("in-memory snapshots every " + std::to_string(config.save_memory_interval) + " iterations in " + dir_ +
         " (a restart resumes from the newest snapshot or save)");
  return Status::ok();
}

Result<RestartPoint> restart_point(const TrainConfig& config, TrainConfig& attempt, const std::string& memory_dir,
                                   const Status& failure) {
  LatestRun latest;
  if (!config.save.empty()) {
    auto on_disk = latest_run(config.save);
    if (!on_disk) return on_disk.status();
    latest = std::move(on_disk).value();
  }
  if (latest.found && latest.run_id != attempt.run_id && !(latest.run_id.empty() && attempt.load == config.save))
    return Status::error(failure.message() + " (not restarted: the latest checkpoint in " + config.save +
                         " was written by another run, run id " + latest.run_id + ", and is not this run's to resume)");
  RestartPoint point;
  if (latest.found) {  // this run's own checkpoint, resumed whole
    attempt.load = config.save;
    attempt.finetune = attempt.no_load_optim = false;
    point = {true, latest.iteration, iteration_dir(config.save, latest.iteration)};
  }
  if (!memory_dir.empty()) {  // the in-memory snapshot, when it is newer
    discard_unfinished_saves(memory_dir, [](const std::string&) {});  // one the failure interrupted
    auto snapshot = latest_run(memory_dir);
    if (snapshot && snapshot->found && (!point.found || snapshot->iteration > point.iteration)) {
      attempt.load = memory_dir;
      attempt.finetune = attempt.no_load_optim = false;
      point = {true, snapshot->iteration,
               "the in-memory snapshot of iteration " + std::to_string(snapshot->iteration) + " (" + memory_dir + ")"};
    }
  }
  if (!point.found)
    point.from = attempt.load.empty() ? std::string("the start (nothing saved yet)") : attempt.load;
  return point;
}

Result<double> measure_job_peak(int threads, comm::Bootstrap* bootstrap, const NoteFn& note, double* local) {
  double peak = local != nullptr ? *local : 0;
  const bool several = bootstrap != nullptr && bootstrap->world_size() > 1;
  if (peak == 0 || (peak < 0 && !several)) {
    ThreadPool pool(threads);
    peak = measure_sgemm_peak_gflops(pool);
    if (local != nullptr) *local = peak;
  }
  if (several) {
    // A process that does not measure (< 0: one started in a failed one's place, which the others
    // wait for) counts as the mean of those that did.
    auto all = bootstrap->all_gather("sgemm_peak", std::to_string(std::max(peak, 0.0)));
    if (!all) return all.status();
    peak = 0;
    int measured = 0;
    for (const std::string& p : all.value()) {
      const double v = std::stod(p);
      peak += v;
      measured += v > 0 ? 1 : 0;
    }
    if (measured > 0) peak *= static_cast<double>(all.value().size()) / measured;
    note("measured sgemm peak: " + std::to_string(static_cast<int>(peak)) + " GFLOP/s over the job's " +
         std::to_string(all.value().size()) + " processes");
  } else {
    note("measured sgemm peak: " + std::to_string(static_cast<int>(peak)) + " GFLOP/s on " + std::to_string(threads) +
         " thread(s)");
  }
  return peak;
}

}  // namespace troupe
