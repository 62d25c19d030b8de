// A fixed pool of CPU threads for data-parallel loops inside one op. The thread that calls
// parallel_for takes part (it runs the first range), so a pool of size n starts n-1 workers.
//
// Two ways to share a loop. parallel_for splits [0, n) into at most size() ranges, so where a
// range's edges fall depends on the thread count: use it only where that cannot change a bit (each
// item is computed by itself, as a row of LayerNorm). for_each_task runs tasks that the caller cut
// from the problem's shape alone, handed to threads in any order: use it for everything whose
// result could depend on the cut (a GEMM tile, a block of column sums), so results are the same for
// every size(). Only one parallel_for / for_each_task runs at a time per pool (calls from several
// threads are serialised; calling one from inside another deadlocks); a pool belongs to one shard,
// as in troupe each shard owns its compute threads.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace troupe {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return size_; }

  // Calls fn(begin, end) on disjoint ranges covering [0, n). At most size() ranges; ranges are
  // never smaller than `grain` items (so tiny loops stay on the calling thread).
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t grain = 1);

  // Calls fn(t) exactly once for every t in [0, tasks), on up to size() threads (the caller's among
  // them); each thread takes the next task not yet taken, so which thread runs a task and in which
  // order is not fixed. Returns when all have run. fn(t) must not depend on the thread it runs on.
  void for_each_task(int64_t tasks, const std::function<void(int64_t)>& fn);

  // Calls fn(thread_index) once on each of the size() threads.
  void run_on_all(const std::function<void(int)>& fn);

 private:
  void worker_loop(int index);
  void dispatch(int parts, const std::function<void(int)>& fn);

  int size_;
  std::vector<std::thread> workers_;
  std::mutex run_mutex_;  // one dispatch at a time
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const std::function<void(int)>* job_ = nullptr;
  int job_parts_ = 0;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

}  // namespace troupe
