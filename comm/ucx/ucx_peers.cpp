// The ucx engine's view of its peers: which ranks are alive, how a failure is noticed (a UCX
// endpoint error, a peer process that is gone, a control message from another rank) and told to the
// others, so that every operation that involves a failed rank fails instead of waiting for it.
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <ucs/debug/log_def.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "comm/ucx/ucx_detail.hpp"
#include "comm/ucx/ucx_engine.hpp"
#include "troupe/check.hpp"

namespace troupe::comm::ucx {

using namespace detail;

void Engine::watch_process(int r, const std::string& identity) {
  const long pid = std::atol(identity_field(identity, "pid").c_str());
  if (pid <= 0) return;
  const int fd = static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0));
  if (fd >= 0) {
    pidfds_[static_cast<size_t>(r)] = fd;
  } else {
    proc_pids_[static_cast<size_t>(r)] = pid;  // older kernels: look at /proc/<pid>/stat
  }
}

bool detail::process_gone(long pid) {
  std::FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (f == nullptr) return true;
  char buf[512];
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = 0;
  const char* close = std::strrchr(buf, ')');  // the command name may contain anything
  return close != nullptr && close[1] == ' ' && (close[2] == 'Z' || close[2] == 'X');
}

void detail::fault_point(int rank, const char* step) {
  const char* spec = std::getenv("TROUPE_FAULT_UCX_KILL");
  if (spec == nullptr) return;
  const char* restarted = std::getenv("TROUPE_RESTART_COUNT");
  if (restarted != nullptr && std::strtol(restarted, nullptr, 10) > 0) return;
  if (spec != "rank" + std::to_string(rank) + "@" + step) return;
  std::fprintf(stderr, "troupe: TROUPE_FAULT_UCX_KILL=%s: killing this process during UCX setup\n",
               spec);
  std::fflush(stderr);
  ::raise(SIGKILL);
}

namespace {

std::atomic<int> g_fatal_rank{-1};

// UCX logs a fatal error, then aborts with a backtrace (UCX_HANDLE_ERRORS=bt). Reaching that is a
// bug (in troupe or UCX), but the process must still end like any failed rank: named, exit 1.
ucs_log_func_rc_t fatal_log_handler(const char* file, unsigned line, const char*,
                                    ucs_log_level_t level, const ucs_log_component_config_t*,
                                    const char* format, va_list ap) {
  if (level != UCS_LOG_LEVEL_FATAL) return UCS_LOG_FUNC_RC_CONTINUE;
  char message[1024];
  std::vsnprintf(message, sizeof message, format, ap);
  const char* base = std::strrchr(file, '/');
  std::fprintf(
      stderr,
      "troupe: error: rank %d (pid %d): UCX failed fatally: %s (%s:%u); this process stops "
      "(exit code 1). If a peer died just before, its log says why; otherwise please "
      "report this line (UCX_HANDLE_ERRORS=bt adds UCX's backtrace)\n",
      g_fatal_rank.load(), static_cast<int>(::getpid()), message, base != nullptr ? base + 1 : file,
      line);
  std::fflush(stderr);
  std::_Exit(1);
}

}  // namespace

void detail::install_fatal_handler(int rank) {
  g_fatal_rank.store(rank);
  static std::once_flag once;
  std::call_once(once, [] {
    if (std::getenv("UCX_HANDLE_ERRORS") == nullptr) ucs_log_push_handler(&fatal_log_handler);
  });
}

std::vector<pollfd> Engine::wait_fds() const {
  std::vector<pollfd> fds;
  fds.push_back(pollfd{efd_, POLLIN, 0});
  for (int r = 0; r < size_; ++r) {
    if (pidfds_[static_cast<size_t>(r)] >= 0 &&
        peer_state_[static_cast<size_t>(r)] == PeerState::alive) {
      fds.push_back(pollfd{pidfds_[static_cast<size_t>(r)], POLLIN, 0});
    }
  }
  return fds;
}

void Engine::handle_watch(const std::vector<pollfd>& fds) {
  bool any = false;
  for (size_t i = 1; i < fds.size(); ++i) any = any || fds[i].revents != 0;
  if (!any) return;
  // A peer that exits normally says goodbye first, and its goodbye may still sit in our queue: take
  // in everything that arrived before calling the exit a failure.
  for (int i = 0; i < 100 && pump(); ++i) {
  }
  for (size_t i = 1; i < fds.size(); ++i) {
    if (fds[i].revents == 0) continue;
    for (int r = 0; r < size_; ++r) {
      if (pidfds_[static_cast<size_t>(r)] == fds[i].fd && !stopping_ &&
          peer_state_[static_cast<size_t>(r)] == PeerState::alive) {
        mark_failed(r, who(r) + " failed (its process exited; see that rank's log)", true);
      }
    }
  }
}

void Engine::request_abort(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(abort_mu_);
    if (abort_reason_.empty()) abort_reason_ = why;
  }
  abort_requested_.store(true, std::memory_order_release);
  if (worker_ != nullptr) ucp_worker_signal(worker_);  // safe from any thread: wakes a sleeping driver
}

void Engine::periodic_checks() {
  // Not rate-limited: request_abort's signal wakes a driver for it.
  if (abort_requested_.load(std::memory_order_acquire) && !aborted_ && !stopping_) {
    aborted_ = true;
    std::string why;
    {
      std::lock_guard<std::mutex> lock(abort_mu_);
      why = abort_reason_;
    }
    for (int r = 0; r < size_; ++r)
      if (r != rank_ && peer_state_[static_cast<size_t>(r)] == PeerState::alive)
        mark_failed(r, "this rank gave the world up (" + why + ")", false);
  }
  const auto now = std::chrono::steady_clock::now();
  if (now < next_check_) return;
  next_check_ = now + std::chrono::milliseconds(20);
  std::vector<pollfd> fds = wait_fds();
  if (fds.size() > 1) {
    (void)::poll(fds.data() + 1, fds.size() - 1, 0);
    fds[0].revents = 0;
    handle_watch(fds);
  }
  std::vector<int> gone;
  for (int r = 0; r < size_; ++r) {
    const long pid = proc_pids_[static_cast<size_t>(r)];
    if (pid > 0 && peer_state_[static_cast<size_t>(r)] == PeerState::alive && process_gone(pid))
      gone.push_back(r);
  }
  if (!gone.empty()) {
    for (int i = 0; i < 100 && pump(); ++i) {  // its goodbye may still be queued (see handle_watch)
    }
    for (int r : gone) {
      if (!stopping_ && peer_state_[static_cast<size_t>(r)] == PeerState::alive) {
        mark_failed(r, who(r) + " failed (its process exited; see that rank's log)", true);
      }
    }
  }
  abandon_stale_failures();
}

void Engine::abandon_stale_failures() {
  const auto now = std::chrono::steady_clock::now();
  std::vector<Op*> all;
  for (auto& op : ops_) all.push_back(op.get());
  for (Op* op : all) {
    if (op->abandon_if_stale(now, std::chrono::milliseconds(1000))) abandoned_ = true;
  }
}

// ------------------------------------------------------------------------------------------------
// Engine: failures

void Engine::ep_error_cb(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* c = static_cast<EpContext*>(arg);
  c->engine->ep_errors_.emplace_back(c->rank, status);
}

ucs_status_t Engine::am_control_cb(void* arg, const void* header, size_t header_length, void*,
                                   size_t, const ucp_am_recv_param_t*) {
  auto* e = static_cast<Engine*>(arg);
  if (header_length == sizeof(ControlHeader)) {
    ControlHeader h;
    std::memcpy(&h, header, sizeof h);
    if (h.rank >= 0 && h.rank < e->size_ && h.from >= 0 && h.from < e->size_) {
      e->controls_.push_back(ControlEvent{h.type, h.rank, h.from});
    }
  }
  return UCS_OK;
}

void Engine::send_control(int to, uint32_t type, int about) {
  if (eps_[static_cast<size_t>(to)] == nullptr) return;
  auto* h = new ControlHeader{type, about, rank_};  // must outlive the send; freed on completion
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = [](void* req, ucs_status_t, void* user_data) {
    ucp_request_free(req);
    delete static_cast<ControlHeader*>(user_data);
  };
  p.user_data = h;
  ucs_status_ptr_t r =
      ucp_am_send_nbx(eps_[static_cast<size_t>(to)], kAmControl, h, sizeof *h, nullptr, 0, &p);
  if (r == nullptr || UCS_PTR_IS_ERR(r)) delete h;
}

void Engine::mark_failed(int r, const std::string& reason, bool tell_others) {
  peer_state_[static_cast<size_t>(r)] = PeerState::failed;
  peer_reason_[static_cast<size_t>(r)] = reason;
  std::vector<Op*> affected;
  for (auto& op : ops_) {
    if (op->involves(r)) affected.push_back(op.get());
  }
  for (Op* op : affected) {
    op->fail(Status::error(op->name() + ": " + reason));
    reap(op);
  }
  // A failed endpoint is closed at once with FORCE: UCX then completes (cancels) every request
  // still on it, which a peer without UCX error handling would otherwise hold for ever.
  if (ucp_ep_h ep = eps_[static_cast<size_t>(r)]; ep != nullptr) {
    eps_[static_cast<size_t>(r)] = nullptr;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    void* req = ucp_ep_close_nbx(ep, &p);
    if (req != nullptr && !UCS_PTR_IS_ERR(req)) closing_.push_back(req);
  }
  abandon_stale_failures();
  if (!tell_others) return;
  for (int q = 0; q < size_; ++q) {
    if (q != rank_ && q != r && peer_state_[static_cast<size_t>(q)] == PeerState::alive)
      send_control(q, kControlDown, r);
  }
}

void Engine::handle_peer_error(int r, ucs_status_t status) {
  if (stopping_ || peer_state_[static_cast<size_t>(r)] != PeerState::alive) return;
  mark_failed(
      r,
      who(r) + " failed (" + ucs_message(status) +
          " on its endpoint: the process exited or the network failed; see that rank's log)",
      true);
}

void Engine::handle_control(const ControlEvent& e) {
  if (e.rank == rank_ || peer_state_[static_cast<size_t>(e.rank)] != PeerState::alive) return;
  if (e.type == kControlDown) {
    if (stopping_) return;
    mark_failed(e.rank,
                who(e.rank) + " failed (reported by rank " + std::to_string(e.from) +
                    "; see rank " + std::to_string(e.rank) + "'s log)",
                false);
  } else if (e.type == kControlBye) {
    peer_state_[static_cast<size_t>(e.rank)] = PeerState::departed;
    // Everything it sent was flushed before the goodbye: a receive from it still open never
    // completes.
    std::vector<Op*> stuck;
    for (auto& op : ops_) {
      if (op->waits_on(e.rank)) stuck.push_back(op.get());
    }
    for (Op* op : stuck) {
      op->fail(Status::error(op->name() + ": " + peer_status(e.rank).message()));
      reap(op);
    }
  }
}

}  // namespace troupe::comm::ucx
