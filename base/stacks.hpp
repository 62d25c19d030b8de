// Every thread's native stack in this process, now (the inspector's `stacks`, the stall file;
// docs/INSPECT.md). Linux only.
//
// How: the calling thread sends each other thread of /proc/self/task a real-time signal (the first
// of SIGRTMIN+4 .. SIGRTMAX-1 that nobody handles, chosen once; glibc keeps the signals below
// SIGRTMIN, and neither CAF, UCX (its async events use threads, and SIGALRM in signal mode) nor
// OpenBLAS uses real-time signals) with rt_tgsigqueueinfo, the address of a preallocated slot in
// the signal's value. The handler only calls glibc's backtrace() into that slot (backtrace is
// primed once outside any handler, so libgcc is loaded and no malloc happens inside) and marks it
// done. The caller waits at most `timeout` for every answer, then symbolises outside the handler:
// dladdr (the executable's functions need it linked with -rdynamic, as troupe is) and
// abi::__cxa_demangle. A thread that has the signal blocked, or does not run within the timeout,
// is reported as not answering; its slot is never freed, so its late answer writes into memory
// that is still there.
//
// The handler is installed with SA_RESTART: most interrupted system calls restart; poll, epoll_wait
// and nanosleep return EINTR, which their callers in troupe retry.
//
// Thread safety: any thread may call capture_stacks; calls are serialised.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace troupe {

struct StackFrame {
  uintptr_t address = 0;
  std::string module;             // the file the address is in ("" when unknown)
  uintptr_t offset = 0;           // address - the module's load address (for addr2line -e MODULE)
  std::string function;           // demangled; "" when no symbol covers the address
  uintptr_t function_offset = 0;  // address - the function's start
  std::string describe() const;   // "troupe::Foo::bar(int)+0x1c (/usr/bin/troupe+0x2f1c0)"
};

struct ThreadStack {
  int tid = 0;
  std::string name;       // /proc/self/task/TID/comm
  bool answered = false;  // false: it did not answer within the timeout (signal blocked, or stuck)
  bool caller = false;    // the thread that called capture_stacks
  std::vector<StackFrame> frames;  // innermost first
};

struct ProcessStacks {
  int pid = 0;
  int signal = 0;  // the signal used (0: none could be installed, see error)
  std::string error;
  std::vector<ThreadStack> threads;  // by tid
};

ProcessStacks capture_stacks(std::chrono::milliseconds timeout = std::chrono::milliseconds(1000));

}  // namespace troupe
