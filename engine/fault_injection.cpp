#include "engine/fault_injection.hpp"

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <thread>

namespace troupe {

namespace {

bool restarted_process() {
  const char* r = std::getenv("TROUPE_RESTART_COUNT");
  return r != nullptr && std::strtol(r, nullptr, 10) > 0;
}

}  // namespace

void throw_if_asked(const std::string& kind, int index, int64_t iteration) {
  static std::atomic<bool> fired{false};
  const char* spec = std::getenv("TROUPE_FAULT_THROW");
  if (spec == nullptr || fired.load() || restarted_process()) return;
  const std::string want = spec;
  const std::string self =
      (index >= 0 ? kind + std::to_string(index) : kind) + "@" + std::to_string(iteration);
  if (want != self || fired.exchange(true)) return;
  throw std::runtime_error("fault injected by TROUPE_FAULT_THROW=" + want);
}

void hang_if_asked(const std::string& kind, int index, int64_t iteration) {
  const char* spec = std::getenv("TROUPE_FAULT_HANG");
  if (spec == nullptr || restarted_process()) return;
  const std::string self =
      (index >= 0 ? kind + std::to_string(index) : kind) + "@" + std::to_string(iteration);
  if (spec != self) return;
  std::fprintf(stderr, "troupe: TROUPE_FAULT_HANG=%s: this actor stops answering\n", spec);
  std::fflush(stderr);
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}

void crash_if_asked(int64_t iteration) {
  const char* v = std::getenv("TROUPE_FAULT_KILL_AFTER_SHARD");
  if (v == nullptr || restarted_process() || std::strtoll(v, nullptr, 10) != iteration) return;
  std::fprintf(stderr,
               "troupe: TROUPE_FAULT_KILL_AFTER_SHARD=%s: killing this process during the save\n",
               v);
  std::fflush(stderr);
  std::raise(SIGKILL);
}

}  // namespace troupe
