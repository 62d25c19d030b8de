// Helpers shared by the tests that start real CAF bootstraps over loopback (test_caf_bootstrap,
// test_secure_transport): a rank's launch environment, a sink for the bootstrap's log lines, and
// bootstrap options with short timeouts.
#pragma once
#include <catch2/catch.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/bootstrap/caf_bootstrap.hpp"

namespace troupe::comm::test {

using namespace std::chrono_literals;

inline LaunchEnv make_env(int rank, int world, int port, const std::string& token) {
  LaunchEnv e;
  e.rank = rank;
  e.world_size = world;
  e.local_rank = rank;
  e.local_world_size = world;
  e.master_addr = "127.0.0.1";
  e.master_port = port;
  e.token = token;
  e.source = "test";
  return e;
}

// Collects the bootstrap's log lines (they come from actor threads).
struct LogSink {
  std::mutex mutex;
  std::vector<std::string> lines;
  std::function<void(const std::string&)> fn() {
    return [this](const std::string& line) {
      std::lock_guard<std::mutex> lock(mutex);
      lines.push_back(line);
    };
  }
  // The first line containing every part, waiting up to `timeout`; "" if none.
  std::string wait_for(const std::vector<std::string>& parts, std::chrono::milliseconds timeout = 5s) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mutex);
        for (const auto& l : lines) {
          bool all = true;
          for (const auto& p : parts) all = all && l.find(p) != std::string::npos;
          if (all) return l;
        }
      }
      if (std::chrono::steady_clock::now() > deadline) return "";
      std::this_thread::sleep_for(20ms);
    }
  }
  std::string wait_for(const char* part, std::chrono::milliseconds timeout = 5s) {
    return wait_for(std::vector<std::string>{part}, timeout);
  }
};

inline CafBootstrapOptions options_with(LogSink& sink) {
  CafBootstrapOptions o;
  o.connect_timeout = 10s;
  o.collective_timeout = 30s;
  o.shutdown_grace = 3s;
  o.log = sink.fn();
  return o;
}

inline std::unique_ptr<CafBootstrap> create_ok(const LaunchEnv& env, const CafBootstrapOptions& o) {
  auto b = create_caf_bootstrap(env, o);
  INFO("rank " << env.rank << ": " << (b ? std::string("ok") : b.status().message()));
  REQUIRE(b);
  return std::move(*b);
}

}  // namespace troupe::comm::test
