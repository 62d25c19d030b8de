// Pacing of background writes: while a WritePacing lives on a thread, that thread's checkpoint
// dataset writes go in blocks of at most kPacedBlockBytes (one-dimensional data, i.e. shard pieces,
// is split; checksums included), and after each block or smaller dataset `after_block` is called
// with the CPU seconds the thread spent on it (not the wall time: at the lowest priority a writer
// waits for a core longer than it works); it may sleep, so that a background writer (the offload actor) leaves
// the cores to the training.
#pragma once
#include <cstddef>
#include <functional>

namespace troupe {

inline constexpr size_t kPacedBlockBytes = size_t{4} << 20;

// The CPU time this thread has used, in seconds: what the pacer counts (a writer at the lowest
// priority waits for the cores longer than it works, and that wait is not work to make up for by
// sleeping).
double thread_cpu_seconds();

class WritePacing {
 public:
  explicit WritePacing(std::function<void(double seconds)> after_block);
  ~WritePacing();
  WritePacing(const WritePacing&) = delete;
  WritePacing& operator=(const WritePacing&) = delete;

  // This thread's innermost pacing, or null.
  static const std::function<void(double)>* current();

 private:
  std::function<void(double)> after_block_;
  const std::function<void(double)>* previous_;
};

}  // namespace troupe
