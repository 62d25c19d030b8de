#include "storage/write_pacing.hpp"

#include <time.h>

namespace troupe {

namespace {
thread_local const std::function<void(double)>* t_pacer = nullptr;
}

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

WritePacing::WritePacing(std::function<void(double)> after_block)
    : after_block_(std::move(after_block)), previous_(t_pacer) {
  t_pacer = &after_block_;
}

WritePacing::~WritePacing() {
  t_pacer = previous_;
}

const std::function<void(double)>* WritePacing::current() {
  return t_pacer;
}

}  // namespace troupe
