#include "storage/write_pacing.hpp"

namespace troupe {

namespace {
thread_local const std::function<void(double)>* t_pacer = nullptr;
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
