// Scratch that lives with the calling thread (a pool worker): grown once, so a kernel allocates
// nothing after its first call. Slot `which` (0..3) is one buffer per element type and thread; a
// kernel may use each slot for one buffer at a time, and kernels do not nest, so one set serves all.
#pragma once
#include <cstddef>
#include <vector>

namespace troupe::cpu {

template <class T>
T* thread_scratch(size_t n, int which) {
  thread_local std::vector<T> buf[4];
  if (buf[which].size() < n) buf[which].resize(n);
  return buf[which].data();
}

}  // namespace troupe::cpu
