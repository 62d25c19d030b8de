#include "actors/offload_actor.hpp"

#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <optional>
#include <thread>

#include "actors/errors.hpp"
#include "comm/communicator.hpp"
#include "engine/fault_injection.hpp"
#include "storage/write_pacing.hpp"

namespace troupe {

namespace {

// Threads runnable on the machine right now (/proc/stat's procs_running), or -1.
int runnable_threads() {
  std::FILE* f = std::fopen("/proc/stat", "r");
  if (f == nullptr) return -1;
  char line[256];
  int running = -1;
  while (std::fgets(line, sizeof line, f) != nullptr)
    if (std::sscanf(line, "procs_running %d", &running) == 1) break;
  std::fclose(f);
  return running;
}

// The writer's pacing (storage/write_pacing.hpp): after each block, when the machine has no idle
// core (the ranks compute on all of them), it sleeps so that it works at most `duty` of the time
// (TROUPE_SAVE_DUTY, default 0.1); with idle cores it writes at full speed. Measured on 2 cores
// that both compute (bench/run_save_bench.sh, 292 MiB): unpaced, the lowest priority alone still
// slowed the overlapping step by +40%; duty 0.2 gave +16-20% over ~3 s of writing, 0.1 +2-4% over
// ~6 s. Once the job drains its queue (training over) it writes at full speed.
std::function<void(double)> make_pacer(std::shared_ptr<std::atomic<int>> saves_in_flight,
                                       std::shared_ptr<std::atomic<bool>> draining) {
  double duty = 0.1;
  if (const char* d = std::getenv("TROUPE_SAVE_DUTY")) duty = std::clamp(std::atof(d), 0.01, 1.0);
  cpu_set_t set;
  CPU_ZERO(&set);
  const int cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  // A core counts as idle only after 3 samples in a row found one: compute threads that happen to wait
  // at one sample (a collective, the optimizer) must not turn the pacing off.
  auto idle_streak = std::make_shared<int>(0);
  return [duty, cores, saves_in_flight, draining, idle_streak](double seconds) {
    if (duty >= 1.0 || saves_in_flight->load() > 1 || draining->load()) return;
    *idle_streak = runnable_threads() - 1 < cores ? *idle_streak + 1 : 0;  // minus this writer
    if (*idle_streak >= 3) return;
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds * (1.0 - duty) / duty));
  };
}

// Runs one shard's write on a thread of its own (its exceptions passed back): while the ranks train
// (`yielding`) at the lowest priority, so that it takes the cores' slack (and a small share when there
// is none) and a save barely slows training yet still finishes; once the job drains, at the process's
// own priority (a thread cannot raise its priority back without privileges, hence a thread per write:
// on a machine busy with other work, the lowest priority left a job's last save crawling for minutes).
Status write_on_own_thread(bool yielding, const std::function<Status()>& write) {
  Status st;
  std::exception_ptr error;
  std::thread worker([&] {
    pthread_setname_np(pthread_self(), "troupe-writer");  // top -H, perf: the offload writer's time
    std::optional<comm::BackgroundWaits> background;  // a snapshot copy's waits sleep, not poll
    if (yielding) {
      (void)setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 19);
      background.emplace();
    }
    try {
      st = write();
    } catch (...) {
      error = std::current_exception();
    }
  });
  worker.join();
  if (error) std::rethrow_exception(error);
  return st;
}

struct OffloadState {
  std::function<Status(const SaveRequest&)> commit;
  caf::actor listener;
  std::shared_ptr<HostPool> pool;  // held for the process's optimizer partitions
  std::map<int64_t, std::chrono::steady_clock::time_point>
      started;  // iteration -> first shard queued
  std::map<int64_t, int> in_place;  // iteration -> its shards written where a kept file lay
  std::map<int64_t, double> writer_cpu;  // iteration -> CPU seconds its shards' writes took
  std::shared_ptr<std::atomic<int>> saves_in_flight;
  std::shared_ptr<std::atomic<int64_t>> mailbox;
  std::shared_ptr<std::atomic<bool>> draining;
  Status failure;
};

offload_actor::behavior_type offload_behavior(offload_actor::stateful_pointer<OffloadState> self,
                                              std::function<Status(const SaveRequest&)> commit,
                                              caf::actor listener, std::shared_ptr<HostPool> pool,
                                              std::shared_ptr<std::atomic<int>> saves_in_flight,
                                              std::shared_ptr<std::atomic<int64_t>> mailbox,
                                              std::shared_ptr<std::atomic<bool>> draining) {
  name_exceptions(self, "the offload actor");
  self->state.commit = std::move(commit);
  self->state.listener = std::move(listener);
  self->state.pool = std::move(pool);
  self->state.saves_in_flight = std::move(saves_in_flight);
  self->state.mailbox = std::move(mailbox);
  self->state.draining = std::move(draining);
  auto gauge = [self] { self->state.mailbox->store(static_cast<int64_t>(self->mailbox().size())); };
  auto failed = [self](const Status& st) {
    if (!self->state.failure) return;  // the first failure is the one reported
    self->state.failure = st;
    caf::anon_send(self->state.listener, failed_atom::value,
                   "background checkpoint save: " + st.message());
  };
  return {
      [self, failed, gauge](write_atom, ShardWrite& w) {
        gauge();
        if (!self->state.failure) return;  // a save already failed: the job is stopping
        throw_if_asked("offload", -1, w.iteration);
        self->state.started.emplace(w.iteration, std::chrono::steady_clock::now());
        const bool yielding = !self->state.draining->load();
        if (Status st = write_on_own_thread(yielding, [&] {
              const WritePacing pacing(make_pacer(self->state.saves_in_flight, self->state.draining));
              const double cpu0 = thread_cpu_seconds();
              struct Count {  // the thread's work on this shard, however the write ends
                double& total;
                double from;
                ~Count() { total += thread_cpu_seconds() - from; }
              } count{self->state.writer_cpu[w.iteration], cpu0};
              if (!w.recycler) return write_shard_file(w.path, w.rank, std::move(w.contents));
              // An in-memory snapshot: into the kept file its pieces were copied into, and kept itself
              // for a later one (engine/buffer_recycler.hpp). The pieces go only after that: their
              // places must not be handed out while the file is still being made a snapshot.
              const std::optional<ShardFileReuse> reuse = w.recycler->file_holding(w.contents);
              ShardWriteStats stats;
              Status wrote = write_shard_file(w.path, w.rank, w.contents, &stats, reuse ? &*reuse : nullptr);
              w.recycler->after_write(w.path, wrote.is_ok(), stats, reuse);
              if (wrote && stats.in_place) ++self->state.in_place[w.iteration];
              w.contents = ShardContents();
              return wrote;
            });
            !st)
          return failed(st);
        crash_if_asked(w.iteration);
      },
      [self, failed, gauge](commit_atom, const SaveRequest& r) {
        gauge();
        if (!self->state.failure) return;
        // An in-memory snapshot's commit carries its copies to the buddy host (engine/snapshot_copies.hpp):
        // reading, checking and writing a shard's bytes, work that yields to the training as the writes do.
        const bool yielding = r.memory && !self->state.draining->load();
        Status committed = write_on_own_thread(yielding, [&] {
          const double own0 = thread_cpu_seconds();
          Status st = self->state.commit(r);
          self->state.writer_cpu[r.iteration] += thread_cpu_seconds() - own0;
          return st;
        });
        self->state.saves_in_flight->fetch_sub(1);
        if (!committed) return failed(committed);
        SavedCheckpoint done;
        done.iteration = r.iteration;
        done.path = r.dir;
        done.committed = true;
        done.memory = r.memory;
        if (auto it = self->state.started.find(r.iteration); it != self->state.started.end()) {
          done.seconds =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - it->second).count();
          self->state.started.erase(it);
        }
        if (auto it = self->state.writer_cpu.find(r.iteration); it != self->state.writer_cpu.end()) {
          done.writer_cpu_seconds = it->second;
          self->state.writer_cpu.erase(it);
        }
        if (auto it = self->state.in_place.find(r.iteration); it != self->state.in_place.end()) {
          done.shards_in_place = it->second;
          self->state.in_place.erase(it);
        }
        caf::anon_send(self->state.listener, save_atom::value, done);
      },
      [self](flush_atom) -> caf::result<ok_atom> {
        if (!self->state.failure)
          return make_actor_error(ActorErrc::failed, self->state.failure.message());
        return ok_atom::value;
      },
  };
}

}  // namespace

offload_actor spawn_offload(caf::actor_system& system,
                            std::function<Status(const SaveRequest&)> commit, caf::actor listener,
                            std::shared_ptr<HostPool> pool,
                            std::shared_ptr<std::atomic<int>> saves_in_flight,
                            std::shared_ptr<std::atomic<int64_t>> mailbox,
                            std::shared_ptr<std::atomic<bool>> draining) {
  return system.spawn<caf::detached>(offload_behavior, std::move(commit), std::move(listener),
                                     std::move(pool), std::move(saves_in_flight), std::move(mailbox),
                                     std::move(draining));
}

}  // namespace troupe
