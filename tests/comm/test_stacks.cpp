// capture_stacks (base/stacks.hpp; here beside the flight recorder, the other half of the
// inspector's `stacks`): every thread of the process answers with its own stack, named as
// /proc/self/task/TID/comm says; a thread that blocks the signal is reported as not answering
// without holding the caller past the timeout; the threads' work goes on undisturbed.
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "base/stacks.hpp"

using namespace troupe;

namespace {

struct Parked {
  std::mutex mu;
  std::condition_variable cv;
  bool go = false;
  std::atomic<int> tid{0};
  std::atomic<int> wakeups{0};  // the condition variable's predicate evaluations
  std::thread thread;

  // blocked: the thread blocks every signal first.
  void start(const char* name, bool blocked) {
    thread = std::thread([this, name, blocked] {
      if (blocked) {
        sigset_t all;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, nullptr);
      }
      pthread_setname_np(pthread_self(), name);
      tid = static_cast<int>(::syscall(SYS_gettid));
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [this] {
        ++wakeups;
        return go;
      });
    });
    while (tid == 0) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // in the wait now
  }
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu);
      go = true;
    }
    cv.notify_all();
    thread.join();
  }
};

const ThreadStack* find(const ProcessStacks& s, int tid) {
  for (const ThreadStack& t : s.threads)
    if (t.tid == tid) return &t;
  return nullptr;
}

bool has_frame(const ThreadStack& t, const std::string& part) {
  for (const StackFrame& f : t.frames)
    if (f.function.find(part) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST_CASE("every thread answers with its own stack, named", "[comm][stacks]") {
  Parked a, b;
  a.start("parked-a", false);
  b.start("parked-b", false);
  const ProcessStacks s = capture_stacks(std::chrono::milliseconds(2000));
  CHECK(s.error == "");
  CHECK(s.signal >= SIGRTMIN);
  CHECK(s.pid == ::getpid());
  CHECK(s.threads.size() >= 3);
  for (Parked* p : {&a, &b}) {
    const ThreadStack* t = find(s, p->tid);
    REQUIRE(t != nullptr);
    CHECK(t->answered);
    CHECK_FALSE(t->caller);
    CHECK(t->name == (p == &a ? "parked-a" : "parked-b"));
    REQUIRE(t->frames.size() >= 3);
    // Inside glibc's pthread_cond_wait (an exported function: named), called from this test's
    // code, itself called from libstdc++'s thread entry further out (a hidden symbol: module and
    // offset only).
    CHECK(has_frame(*t, "pthread_cond_wait"));
    bool libstdcxx = false;
    for (const StackFrame& f : t->frames)
      libstdcxx = libstdcxx || f.module.find("libstdc++") != std::string::npos;
    CHECK(libstdcxx);
    for (const StackFrame& f : t->frames) {
      CHECK(f.address != 0);
      CHECK_FALSE(f.module.empty());
    }
  }
  // The caller's own stack, from capture_stacks' caller outwards.
  int callers = 0;
  for (const ThreadStack& t : s.threads) callers += t.caller ? 1 : 0;
  CHECK(callers == 1);
  // The signal interrupted no wait for good: no spurious wake-up reached the predicate more than a
  // couple of times, and both threads still finish when told.
  CHECK(a.wakeups.load() <= 3);
  a.stop();
  b.stop();
}

TEST_CASE("a thread with the signal blocked does not hold the caller past the timeout",
          "[comm][stacks]") {
  Parked blocked, open;
  blocked.start("blocked", true);
  open.start("open", false);
  const auto t0 = std::chrono::steady_clock::now();
  const ProcessStacks s = capture_stacks(std::chrono::milliseconds(200));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(seconds < 1.5);
  const ThreadStack* b = find(s, blocked.tid);
  const ThreadStack* o = find(s, open.tid);
  REQUIRE(b != nullptr);
  REQUIRE(o != nullptr);
  CHECK_FALSE(b->answered);
  CHECK(b->frames.empty());
  CHECK(b->name == "blocked");
  CHECK(o->answered);
  CHECK_FALSE(o->frames.empty());
  // A second capture works the same (the first one's unanswered slot stays allocated).
  const ProcessStacks again = capture_stacks(std::chrono::milliseconds(200));
  REQUIRE(find(again, open.tid) != nullptr);
  CHECK(find(again, open.tid)->answered);
  blocked.stop();
  open.stop();
}

TEST_CASE("StackFrame::describe names the function and the module offset", "[comm][stacks]") {
  StackFrame f;
  f.address = 0x7f0000001234;
  f.module = "/usr/lib/libx.so";
  f.offset = 0x1234;
  f.function = "ns::fn(int)";
  f.function_offset = 0x1c;
  CHECK(f.describe() == "ns::fn(int)+0x1c (/usr/lib/libx.so+0x1234)");
  StackFrame unknown;
  unknown.address = 0xabc;
  CHECK(unknown.describe() == "0xabc");
}
