#include "kernels/thread_pool.hpp"

#include <algorithm>
#include <atomic>

#include "troupe/check.hpp"

namespace troupe {

ThreadPool::ThreadPool(int threads) : size_(std::max(1, threads)) {
  for (int i = 1; i < size_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int)>* job;
    bool mine;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
      mine = index < job_parts_;
    }
    if (mine) (*job)(index);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (--pending_ == 0) done_.notify_one();
    }
  }
}

void ThreadPool::dispatch(int parts, const std::function<void(int)>& fn) {
  if (parts <= 1 || workers_.empty()) {
    for (int i = 0; i < parts; ++i) fn(i);
    return;
  }
  std::lock_guard<std::mutex> run_lock(run_mutex_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = &fn;
    job_parts_ = parts;
    pending_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  wake_.notify_all();
  fn(0);
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [&] { return pending_ == 0; });
  job_ = nullptr;
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                              int64_t grain) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  int parts = static_cast<int>(std::min<int64_t>(size_, (n + grain - 1) / grain));
  if (parts <= 1) {
    fn(0, n);
    return;
  }
  std::function<void(int)> part = [&](int p) {
    int64_t begin = n * p / parts, end = n * (p + 1) / parts;
    if (begin < end) fn(begin, end);
  };
  dispatch(parts, part);
}

void ThreadPool::for_each_task(int64_t tasks, const std::function<void(int64_t)>& fn) {
  if (tasks <= 0) return;
  const int parts = static_cast<int>(std::min<int64_t>(size_, tasks));
  if (parts <= 1) {
    for (int64_t t = 0; t < tasks; ++t) fn(t);
    return;
  }
  // Taking tasks from a counter (rather than a fixed share each) lets a thread that another process
  // delays fall behind without holding the others up; the results do not care who ran what.
  std::atomic<int64_t> next{0};
  std::function<void(int)> part = [&](int) {
    for (int64_t t = next.fetch_add(1, std::memory_order_relaxed); t < tasks;
         t = next.fetch_add(1, std::memory_order_relaxed))
      fn(t);
  };
  dispatch(parts, part);
}

void ThreadPool::run_on_all(const std::function<void(int)>& fn) {
  dispatch(size_, fn);
}

}  // namespace troupe
