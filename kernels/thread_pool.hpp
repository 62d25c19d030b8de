// A fixed pool of CPU threads for data-parallel loops inside one op. The thread that calls
// parallel_for takes part (it runs the first range), so a pool of size n starts n-1 workers.
//
// Ranges are split statically and identically for a given (n, size()), so every op that reduces
// across a range is deterministic run to run. Only one parallel_for runs at a time per pool (calls
// from several threads are serialised); a pool belongs to one shard, as in troupe each shard owns
// its compute threads.
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

  // Calls fn(begin, end) on disjoint ranges covering [0, n). At most size() ranges; ranges are never
  // smaller than `grain` items (so tiny loops stay on the calling thread).
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t grain = 1);

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
