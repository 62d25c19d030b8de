// What the flight recorder (comm/flight_recorder.hpp) adds to one communication operation, the
// figures docs/INSPECT.md quotes: a record on its own (issue, the wait's start, its end) on one
// thread with no contention, and the whole path of an empty all-reduce through a recorded
// communicator and its Work against the plain one, as a ratio in the same run. Each figure is the
// best of --rounds rounds of --ops operations, so that a loaded machine's pauses do not count.
//
//   build/bin/bench_flight_recorder [--rounds 10] [--ops 20000]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>

#include "comm/flight_recorder.hpp"
#include "comm/local/local_world.hpp"

using namespace troupe;
using namespace troupe::comm;

namespace {

int flag_value(int argc, char** argv, const char* name, int fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::max(1, std::atoi(argv[i + 1]));
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  using Clock = std::chrono::steady_clock;
  const int rounds = flag_value(argc, argv, "--rounds", 10);
  const int ops = flag_value(argc, argv, "--ops", 20'000);
  auto best = [&](const std::function<void()>& one) {
    double min_ns = 1e300;
    for (int round = 0; round < rounds; ++round) {
      const auto t0 = Clock::now();
      for (int i = 0; i < ops; ++i) one();
      min_ns = std::min(min_ns,
                        std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / ops);
    }
    return min_ns;
  };

  FlightRecorder rec(0);
  FlightOp op;
  op.kind = FlightKind::all_reduce;
  op.group = rec.add_group("tp", {0, 1});
  const double record_ns = best([&] {
    const uint64_t id = rec.issue(op);
    rec.started(id);
    rec.finished(id, true);
  });

  // An all_reduce of 0 elements, which the local backend completes at once (it involves no other
  // rank), plain and recorded.
  auto fabric = LocalFabric::create(1, {});
  if (!fabric.is_ok()) {
    std::fprintf(stderr, "bench_flight_recorder: %s\n", fabric.status().message().c_str());
    return 1;
  }
  auto plain = fabric.value().world(0)->group({0});
  auto inner = fabric.value().world(0)->group({0});
  if (!plain.is_ok() || !inner.is_ok()) {
    std::fprintf(stderr, "bench_flight_recorder: cannot make a group of one rank\n");
    return 1;
  }
  auto wrapped =
      record_flight(std::move(inner).value(), std::make_shared<FlightRecorder>(0), "world", {0});
  float x = 1;
  const double plain_ns =
      best([&] { (void)plain.value()->all_reduce(&x, 0, DType::f32, ReduceOp::sum)->wait(); });
  const double recorded_ns =
      best([&] { (void)wrapped->all_reduce(&x, 0, DType::f32, ReduceOp::sum)->wait(); });
  std::printf("record (issue + started + finished): %.1f ns\n", record_ns);
  std::printf("empty all_reduce: %.1f ns plain, %.1f ns recorded (+%.1f ns, ratio %.3f)\n",
              plain_ns, recorded_ns, recorded_ns - plain_ns, recorded_ns / plain_ns);
  return 0;
}
