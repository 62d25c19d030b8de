#include "base/stacks.hpp"

#include <cxxabi.h>
#include <dirent.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <thread>

namespace troupe {

namespace {

constexpr int kMaxFrames = 64;
constexpr uint64_t kMagic = 0x7472'6f75'7065'5354;  // "troupeST"

enum SlotState : int { kWaiting = 0, kWriting = 1, kDone = 2, kAbandoned = 3 };

// One thread's answer. Written by that thread's signal handler only.
struct Slot {
  uint64_t magic = kMagic;
  std::atomic<int> state{kWaiting};
  int depth = 0;
  void* frames[kMaxFrames];
};

void on_stack_signal(int, siginfo_t* info, void*) {
  // Only our own requests: rt_tgsigqueueinfo from this process, with a slot.
  if (info == nullptr || info->si_code != SI_QUEUE || info->si_pid != ::getpid()) return;
  auto* slot = static_cast<Slot*>(info->si_value.sival_ptr);
  if (slot == nullptr || slot->magic != kMagic) return;
  int expected = kWaiting;
  if (!slot->state.compare_exchange_strong(expected, kWriting)) return;  // abandoned: too late
  const int saved = errno;
  slot->depth = ::backtrace(slot->frames, kMaxFrames);
  slot->state.store(kDone, std::memory_order_release);
  errno = saved;
}

// The signal, installed once: the first real-time signal from SIGRTMIN+4 that nobody handles.
int install_handler(std::string& error) {
  static int installed = 0;
  static std::string why;
  static std::once_flag once;
  std::call_once(once, [] {
    void* prime[2];
    (void)::backtrace(prime, 2);  // loads libgcc's unwinder now, not inside a handler
    for (int sig = SIGRTMIN + 4; sig < SIGRTMAX; ++sig) {
      struct sigaction old {};
      if (::sigaction(sig, nullptr, &old) != 0) continue;
      const bool unused = (old.sa_flags & SA_SIGINFO) == 0 && old.sa_handler == SIG_DFL;
      if (!unused) continue;
      struct sigaction sa {};
      sa.sa_sigaction = on_stack_signal;
      sa.sa_flags = SA_SIGINFO | SA_RESTART;
      sigemptyset(&sa.sa_mask);
      if (::sigaction(sig, &sa, nullptr) == 0) {
        installed = sig;
        return;
      }
    }
    why =
        "no free real-time signal to ask the threads with (SIGRTMIN+4 .. SIGRTMAX-1 all have "
        "handlers)";
  });
  error = why;
  return installed;
}

std::vector<int> thread_ids() {
  std::vector<int> tids;
  if (DIR* d = ::opendir("/proc/self/task")) {
    while (dirent* e = ::readdir(d)) {
      const int tid = std::atoi(e->d_name);
      if (tid > 0) tids.push_back(tid);
    }
    ::closedir(d);
  }
  std::sort(tids.begin(), tids.end());
  return tids;
}

std::string thread_name(int tid) {
  std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/comm");
  std::string name;
  std::getline(in, name);
  return name;
}

bool send_request(int sig, int tid, Slot* slot) {
  siginfo_t info;
  std::memset(&info, 0, sizeof info);
  info.si_signo = sig;
  info.si_code = SI_QUEUE;
  info.si_pid = ::getpid();
  info.si_uid = ::getuid();
  info.si_value.sival_ptr = slot;
  return ::syscall(SYS_rt_tgsigqueueinfo, ::getpid(), tid, sig, &info) == 0;
}

// frames[first..depth) as StackFrames. A frame past the innermost one holds a return address: the
// call is the byte before it (which matters when a call is a function's last instruction).
std::vector<StackFrame> symbolise(void* const* frames, int depth, int first, bool innermost_exact) {
  std::vector<StackFrame> out;
  for (int i = first; i < depth; ++i) {
    StackFrame f;
    f.address = reinterpret_cast<uintptr_t>(frames[i]);
    if (f.address == 0) continue;
    const uintptr_t lookup = (i == first && innermost_exact) ? f.address : f.address - 1;
    Dl_info dl{};
    if (::dladdr(reinterpret_cast<void*>(lookup), &dl) != 0) {
      if (dl.dli_fname != nullptr) f.module = dl.dli_fname;
      f.offset = f.address - reinterpret_cast<uintptr_t>(dl.dli_fbase);
      if (dl.dli_sname != nullptr) {
        int status = 0;
        char* demangled = abi::__cxa_demangle(dl.dli_sname, nullptr, nullptr, &status);
        f.function = status == 0 && demangled != nullptr ? demangled : dl.dli_sname;
        std::free(demangled);
        f.function_offset = f.address - reinterpret_cast<uintptr_t>(dl.dli_saddr);
      }
    }
    out.push_back(std::move(f));
  }
  return out;
}

// The handler's own frames: on_stack_signal and the kernel's signal trampoline (__restore_rt in
// libc), above the interrupted code.
constexpr int kHandlerFrames = 2;

}  // namespace

std::string StackFrame::describe() const {
  char hex[64];
  std::string s;
  if (!function.empty()) {
    std::snprintf(hex, sizeof hex, "+0x%zx", static_cast<size_t>(function_offset));
    s = function + hex + " ";
  }
  if (module.empty()) {
    std::snprintf(hex, sizeof hex, "0x%zx", static_cast<size_t>(address));
    return s + hex;
  }
  std::snprintf(hex, sizeof hex, "+0x%zx", static_cast<size_t>(offset));
  return s + "(" + module + hex + ")";
}

ProcessStacks capture_stacks(std::chrono::milliseconds timeout) {
  static std::mutex one_at_a_time;
  std::lock_guard<std::mutex> lock(one_at_a_time);
  ProcessStacks out;
  out.pid = ::getpid();
  out.signal = install_handler(out.error);
  const int self = static_cast<int>(::syscall(SYS_gettid));
  const std::vector<int> tids = thread_ids();
  auto* slots = new Slot[tids.size()];
  std::vector<bool> asked(tids.size(), false);
  for (size_t i = 0; i < tids.size(); ++i)
    if (tids[i] != self && out.signal != 0) asked[i] = send_request(out.signal, tids[i], &slots[i]);
  // The caller's own stack, while the others answer.
  void* mine[kMaxFrames];
  const int my_depth = ::backtrace(mine, kMaxFrames);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    bool all = true;
    for (size_t i = 0; i < tids.size(); ++i)
      if (asked[i] && slots[i].state.load(std::memory_order_acquire) != kDone) all = false;
    if (all || std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  bool leave = false;  // a slot a late handler may still write
  for (size_t i = 0; i < tids.size(); ++i) {
    ThreadStack t;
    t.tid = tids[i];
    t.name = thread_name(tids[i]);
    if (tids[i] == self) {
      t.caller = true;
      t.answered = true;
      t.frames = symbolise(mine, my_depth, 1, false);  // from capture_stacks' caller
    } else if (asked[i]) {
      int expected = kWaiting;
      if (!slots[i].state.compare_exchange_strong(expected, kAbandoned)) {
        // Writing: the handler is inside backtrace now; it finishes in microseconds.
        for (int spin = 0; spin < 100 && slots[i].state.load(std::memory_order_acquire) == kWriting;
             ++spin)
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      if (slots[i].state.load(std::memory_order_acquire) == kDone) {
        t.answered = true;
        t.frames = symbolise(slots[i].frames, slots[i].depth, kHandlerFrames, true);
      } else {
        leave = true;
      }
    } else {
      // The thread ended before it was asked: not reported.
      if (out.signal != 0) continue;
    }
    out.threads.push_back(std::move(t));
  }
  if (!leave) delete[] slots;  // else left for ever: a late answer writes there
  return out;
}

}  // namespace troupe
