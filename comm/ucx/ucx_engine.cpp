#include "comm/ucx/ucx_engine.hpp"

#include <poll.h>
#include <sched.h>
#include <sys/syscall.h>
#include <ucs/config/global_opts.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "comm/ucx/ucx_detail.hpp"
#include "troupe/check.hpp"

namespace troupe::comm::ucx {

using namespace detail;

// ------------------------------------------------------------------------------------------------
// Engine: creation

Engine::Engine(int rank, int size, const UcxOptions& options)
    : rank_(rank), size_(size), options_(options) {}

Status Engine::init_ucx() {
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) {
    return Status::error("ucx: reading the UCX configuration failed (" + ucs_message(st) +
                         "); check the UCX_* environment variables");
  }
  if (std::getenv("UCX_TLS") == nullptr) {
    // Every transport but UCX's posix shared memory: its segments have a name in /dev/shm from
    // their creation until UCX unlinks them (it writes the whole segment in between), and a
    // process killed then leaves that file behind for ever. sysv (never named in /dev/shm, removed
    // right after attaching) carries the same traffic; troupe's own segments are anonymous.
    (void)ucp_config_modify(config, "TLS", "^posix");
  }
  if (std::getenv("UCX_KEEPALIVE_INTERVAL") == nullptr && options_.keepalive_ms > 0) {
    // Best effort: an older UCX without keepalive just keeps its default.
    (void)ucp_config_modify(config, "KEEPALIVE_INTERVAL",
                            (std::to_string(options_.keepalive_ms) + "ms").c_str());
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  st = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (st != UCS_OK) {
    context_ = nullptr;
    return Status::error("ucx: ucp_init failed (" + ucs_message(st) +
                         "); check UCX_TLS and UCX_NET_DEVICES (unset them to let UCX choose)");
  }
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;  // creation here, then only the progress thread
  st = ucp_worker_create(context_, &wp, &worker_);
  if (st != UCS_OK) {
    worker_ = nullptr;
    return Status::error("ucx: ucp_worker_create failed (" + ucs_message(st) + ")");
  }
  st = ucp_worker_get_efd(worker_, &efd_);
  if (st != UCS_OK) {
    return Status::error("ucx: the worker has no event fd (" + ucs_message(st) +
                         "); a transport in UCX_TLS does not support wake-up");
  }
  ucp_am_handler_param_t hp{};
  hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                  UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
  hp.id = kAmP2P;
  hp.flags = UCP_AM_FLAG_WHOLE_MSG | UCP_AM_FLAG_PERSISTENT_DATA;
  hp.cb = &Engine::am_p2p_cb;
  hp.arg = this;
  st = ucp_worker_set_am_recv_handler(worker_, &hp);
  if (st == UCS_OK) {
    hp.id = kAmControl;
    hp.flags = UCP_AM_FLAG_WHOLE_MSG;
    hp.cb = &Engine::am_control_cb;
    st = ucp_worker_set_am_recv_handler(worker_, &hp);
  }
  if (st != UCS_OK)
    return Status::error("ucx: registering active-message handlers failed (" + ucs_message(st) +
                         ")");
  return Status::ok();
}

// Creates the endpoint to rank r with the given error-handling mode; UCX's own error log is muted
// meanwhile when `quiet` (a refused MODE_PEER is expected with shared-memory-only transports).
static ucs_status_t create_ep(ucp_worker_h worker, const std::string& address,
                              ucp_err_handling_mode_t mode, ucp_err_handler_cb_t cb, void* arg,
                              bool quiet, ucp_ep_h* ep) {
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  params.address = reinterpret_cast<const ucp_address_t*>(address.data());
  params.err_mode = mode;
  if (cb != nullptr) {
    params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.err_handler.cb = cb;
    params.err_handler.arg = arg;
  }
  char level[64] = "";
  const bool mute = quiet && ucs_global_opts_get_value("LOG_LEVEL", level, sizeof level) == UCS_OK;
  if (mute) (void)ucs_global_opts_set_value("LOG_LEVEL", "fatal");
  ucs_status_t st = ucp_ep_create(worker, &params, ep);
  if (mute) (void)ucs_global_opts_set_value("LOG_LEVEL", level);
  return st;
}

namespace {

// Whether UCX_TLS leaves UCX any shared-memory transport (unset and "all" do).
bool tls_allows_shared_memory() {
  const char* env = std::getenv("UCX_TLS");
  if (env == nullptr || *env == '\0') return true;
  std::string list(env);
  for (char& ch : list) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  const bool exclude = list[0] == '^';
  if (exclude) list.erase(0, 1);
  std::vector<std::string> names;
  size_t pos = 0;
  while (pos <= list.size()) {
    const size_t comma = std::min(list.find(',', pos), list.size());
    names.push_back(list.substr(pos, comma - pos));
    pos = comma + 1;
  }
  auto named = [&](std::initializer_list<const char*> any) {
    for (const std::string& n : names) {
      for (const char* a : any) {
        if (n == a) return true;
      }
    }
    return false;
  };
  if (exclude) return !named({"sm", "shm", "mm"});
  return named({"all", "sm", "shm", "mm", "sysv", "posix", "cma", "xpmem", "knem"});
}

// The last-level cache shared by this CPU, from sysfs (sysconf's figure is wrong in some VMs).
size_t last_level_cache_bytes() {
  size_t best = 0;
  for (int i = 0; i < 8; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::FILE* f = std::fopen((dir + "size").c_str(), "r");
    if (f == nullptr) break;
    char buf[64] = "";
    const bool read = std::fgets(buf, sizeof buf, f) != nullptr;
    std::fclose(f);
    if (!read) continue;
    char* end = nullptr;
    size_t v = std::strtoull(buf, &end, 10);
    if (end != nullptr && (*end == 'K' || *end == 'k')) v <<= 10;
    if (end != nullptr && (*end == 'M' || *end == 'm')) v <<= 20;
    best = std::max(best, v);
  }
  return best >= (size_t{1} << 20) ? best : size_t{32} << 20;
}

}  // namespace

Status Engine::connect(const std::vector<std::string>& addresses,
                       const std::vector<std::string>& identities) {
  eps_.assign(static_cast<size_t>(size_), nullptr);
  ep_contexts_.resize(static_cast<size_t>(size_));
  peer_state_.assign(static_cast<size_t>(size_), PeerState::alive);
  peer_reason_.assign(static_cast<size_t>(size_), std::string());
  pidfds_.assign(static_cast<size_t>(size_), -1);
  proc_pids_.assign(static_cast<size_t>(size_), -1);
  host_keys_.clear();
  peer_names_.clear();
  for (size_t r = 0; r < identities.size(); ++r) {
    const std::string& id = identities[r];
    // Same host = same hostname, pid namespace and network namespace: containers or network
    // namespaces that share a hostname are still separate hosts to the network (their traffic
    // must cross it, not troupe's shared memory).
    host_keys_.push_back(identity_field(id, "host") + "/" + identity_field(id, "pidns") + "/" +
                         identity_field(id, "netns"));
    peer_names_.push_back("rank " + std::to_string(r) + " (host " + identity_field(id, "host") +
                          ", pid " + identity_field(id, "pid") + ")");
  }
  const std::string& my_host = host_keys_[static_cast<size_t>(rank_)];
  // Same-host peers: shared memory (sysv/posix for messages, cma for single-copy rendezvous) is
  // several times faster than anything else, but UCX 1.13 has no UCP_ERR_HANDLING_MODE_PEER for it:
  // with MODE_PEER it falls back to TCP over loopback. So by default same-host endpoints use
  // MODE_NONE and this rank watches the peer's process itself (pidfd); options.same_host_shm =
  // false keeps MODE_PEER.
  const bool shm = options_.same_host_shm && tls_allows_shared_memory();
  for (int r = 0; r < size_; ++r) {
    ep_contexts_[static_cast<size_t>(r)] = EpContext{this, r};
    if (r == rank_) continue;  // messages to self never reach UCX
    const std::string& id = identities[static_cast<size_t>(r)];
    const bool same_host = host_keys_[static_cast<size_t>(r)] == my_host;
    ucp_ep_h& ep = eps_[static_cast<size_t>(r)];
    ucs_status_t st = UCS_ERR_UNREACHABLE;
    if (!(same_host && shm)) {
      // MODE_PEER: UCX reports a dead peer (MODE_NONE would hang on it). Refused when only shared
      // memory is allowed (UCX_TLS=sm,self): then MODE_NONE below.
      st = create_ep(worker_, addresses[static_cast<size_t>(r)], UCP_ERR_HANDLING_MODE_PEER,
                     &Engine::ep_error_cb, &ep_contexts_[static_cast<size_t>(r)], same_host, &ep);
    }
    if (st != UCS_OK && same_host) {
      // The error handler matters in MODE_NONE too: a transport error that UCX cannot recover from
      // (a cma read from a peer that just died) then fails the endpoint and calls it, where
      // without a handler UCX aborts the process. Quiet: a peer that died during setup makes UCX
      // log errors about its vanished shared memory, and that death is reported below as what it
      // is.
      auto none = [&](bool quiet) {
        return create_ep(worker_, addresses[static_cast<size_t>(r)], UCP_ERR_HANDLING_MODE_NONE,
                         &Engine::ep_error_cb, &ep_contexts_[static_cast<size_t>(r)], quiet, &ep);
      };
      st = none(true);
      if (st != UCS_OK) {
        // A dying process loses its memory (UCX's segments with it) before it is a zombie: give
        // it a moment to become one.
        const long pid = std::atol(identity_field(id, "pid").c_str());
        bool gone = process_gone(pid);
        for (int i = 0; i < 50 && !gone; ++i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
          gone = process_gone(pid);
        }
        if (gone) {
          ep = nullptr;
          return Status::error(who(r) +
                               " died during UCX setup (before this rank could connect to it); "
                               "see that rank's log");
        }
        st = none(false);  // alive: let UCX say what is wrong
      }
      if (st == UCS_OK) watch_process(r, id);
    }
    if (st != UCS_OK) {
      ep = nullptr;
      return Status::error(
          "ucx: cannot create an endpoint to " + who(r) + " (" + ucs_message(st) +
          "); check that UCX_TLS / UCX_NET_DEVICES allow a transport that reaches it" +
          (same_host ? "" : " from another host (shared memory alone does not)"));
    }
  }
  return Status::ok();
}

Result<std::shared_ptr<Engine>> Engine::create(Bootstrap& bootstrap, const UcxOptions& options) {
  // The n-th world over one bootstrap object uses key n on every rank.
  const int index = bootstrap.next_use("ucx world");
  std::shared_ptr<Engine> e(new Engine(bootstrap.rank(), bootstrap.world_size(), options));
  install_fatal_handler(e->rank_);
  TROUPE_RETURN_IF_ERROR(e->init_ucx());
  fault_point(e->rank_, "worker");

  ucp_address_t* address = nullptr;
  size_t address_len = 0;
  ucs_status_t st = ucp_worker_get_address(e->worker_, &address, &address_len);
  if (st != UCS_OK)
    return Status::error("ucx: ucp_worker_get_address failed (" + ucs_message(st) + ")");
  // Blob: the settings every rank must share (so a mismatch fails here, not as a hang), who we are
  // (to recognise peers on this host), then the worker address.
  const std::string settings =
      "troupe-ucx 2 ring_threshold=" + std::to_string(options.ring_threshold) +
      " chunk_bytes=" + std::to_string(options.chunk_bytes) +
      " direct_max_ranks=" + std::to_string(options.direct_max_ranks) +
      " shm=" + std::to_string(static_cast<int>(options.shm)) +
      " shm_slot_bytes=" + std::to_string(options.shm_slot_bytes) + "\n";
  // This rank's shared-memory segment (see setup_shm), if shared memory may be used at all.
  std::string shm_note = "disabled";
  if (options.shm != UcxShm::off) {
    if (!options.same_host_shm) {
      shm_note = "disabled by TROUPE_UCX_SAME_HOST=ucx";
    } else if (!tls_allows_shared_memory()) {
      shm_note = "disabled: UCX_TLS allows no shared-memory transport";
    } else if (e->size_ > 1) {
      auto seg = ShmWorld::create(e->rank_, e->size_, options.shm_bytes);
      if (seg.is_ok()) {
        e->shm_ = std::move(seg).value();
      } else {
        shm_note = seg.status().message();
      }
    }
  }
  fault_point(e->rank_, "segment");
  char host[256] = "";
  ::gethostname(host, sizeof host - 1);
  char ns[128] = "", netns[128] = "";
  const ssize_t ns_len = ::readlink("/proc/self/ns/pid", ns, sizeof ns - 1);
  if (ns_len > 0) ns[ns_len] = 0;
  const ssize_t netns_len = ::readlink("/proc/self/ns/net", netns, sizeof netns - 1);
  if (netns_len > 0) netns[netns_len] = 0;
  const std::string identity = std::string("host=") + host + " pidns=" + ns + " netns=" + netns +
                               " pid=" + std::to_string(::getpid()) +
                               " shm=" + (e->shm_ ? e->shm_->descriptor() : "-") + "\n";
  std::string mine =
      settings + identity + std::string(reinterpret_cast<const char*>(address), address_len);
  ucp_worker_release_address(e->worker_, address);

  auto gathered = bootstrap.all_gather("ucx/world" + std::to_string(index) + "/address", mine);
  if (!gathered.is_ok())
    return gathered.status().with_context("ucx: exchanging worker addresses: ");
  std::vector<std::string> addresses, identities;
  for (int r = 0; r < e->size_; ++r) {
    const std::string& blob = gathered.value()[static_cast<size_t>(r)];
    const size_t eol = blob.find('\n');
    if (blob.compare(0, settings.size(), settings) != 0) {
      return Status::error("ucx: rank " + std::to_string(r) + " runs with '" +
                           blob.substr(0, eol == std::string::npos ? 40 : eol) + "' but rank " +
                           std::to_string(e->rank_) + " with '" +
                           settings.substr(0, settings.size() - 1) +
                           "': set TROUPE_UCX_RING_THRESHOLD, TROUPE_UCX_CHUNK_BYTES, "
                           "TROUPE_UCX_DIRECT_MAX_RANKS, TROUPE_UCX_SHM and "
                           "TROUPE_UCX_SHM_SLOT_BYTES alike on all ranks");
    }
    const size_t id_end = blob.find('\n', settings.size());
    if (id_end == std::string::npos)
      return Status::error("ucx: rank " + std::to_string(r) + " sent a malformed address");
    identities.push_back(blob.substr(settings.size(), id_end - settings.size()));
    addresses.push_back(blob.substr(id_end + 1));
  }
  fault_point(e->rank_, "exchange");
  TROUPE_RETURN_IF_ERROR(e->connect(addresses, identities));
  fault_point(e->rank_, "endpoints");
  if (options.shm != UcxShm::off) {
    // Every rank takes this branch (the setting is shared), so the exchange inside matches up.
    Status s = e->setup_shm(bootstrap, index, identities);
    if (!s.is_ok()) return s.with_context("ucx: " + (e->shm_ ? std::string() : shm_note + "; "));
  }
  e->thread_ = std::thread([raw = e.get()] { raw->run(); });
  fault_point(e->rank_, "ready");
  return e;
}

Engine::~Engine() {
  if (thread_.joinable()) {
    stop_.store(true);
    { std::lock_guard<std::mutex> lock(idle_mu_); }
    idle_cv_.notify_all();
    if (worker_ != nullptr) ucp_worker_signal(worker_);
    thread_.join();
  } else if (worker_ != nullptr && !eps_.empty()) {
    shutdown_network();  // creation failed after connecting: no thread ever ran
  }
  // Whatever is left (submitted after the world stopped, or stuck past every deadline) is reported
  // failed, so no waiter hangs; its requests are dropped with the worker.
  if (worker_ != nullptr) {
    const auto later = std::chrono::steady_clock::time_point::max();  // past any grace
    for (auto& op : submitted_)
      op->fail(Status::error(op->name() + ": the ucx world was destroyed"));
    for (auto& op : ops_) {
      op->fail(Status::error(op->name() + ": the ucx world was destroyed"));
      if (op->abandon_if_stale(later, std::chrono::milliseconds(0))) abandoned_ = true;
    }
  }
  for (auto& [key, ch] : channels_) {
    for (auto& [seq, a] : ch.early) release_arrival(a);
    for (Arrival& a : ch.unexpected) release_arrival(a);
  }
  for (Arrival& a : arrivals_) release_arrival(a);
  channels_.clear();
  arrivals_.clear();
  if (worker_ != nullptr) {
    // Requests of abandoned operations (to dead peers) are still in UCX, which warns about each.
    char level[64] = "";
    const bool mute =
        abandoned_ && ucs_global_opts_get_value("LOG_LEVEL", level, sizeof level) == UCS_OK;
    if (mute) (void)ucs_global_opts_set_value("LOG_LEVEL", "error");
    ucp_worker_destroy(worker_);
    if (mute) (void)ucs_global_opts_set_value("LOG_LEVEL", level);
  }
  ops_.clear();  // after the worker: no callback can reach them now
  for (void* slot : all_slots_) std::free(slot);
  for (int fd : pidfds_) {
    if (fd >= 0) ::close(fd);
  }
  if (context_ != nullptr) ucp_cleanup(context_);  // nothing is ucp_mem_map'ed, so no memh to unmap
  shm_.reset();  // after the operations, which point into the segments
}

// ------------------------------------------------------------------------------------------------
// Engine: groups and submission (any thread)

Result<std::shared_ptr<const GroupInfo>> Engine::make_group(const std::vector<int>& members) {
  if (members.empty()) return Status::error("ucx group: the member list is empty");
  std::vector<int> sorted = members;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    return Status::error(
        "ucx group: a rank appears twice in the member list; list each world rank once");
  }
  if (sorted.front() < 0 || sorted.back() >= size_) {
    return Status::error("ucx group: member ranks must lie in [0, " + std::to_string(size_) + ")");
  }
  auto it = std::find(members.begin(), members.end(), rank_);
  if (it == members.end()) {
    return Status::error("ucx group: rank " + std::to_string(rank_) +
                         " is not a member; only members call group() for their group");
  }
  auto info = std::make_shared<GroupInfo>();
  info->members = members;
  info->rank = static_cast<int>(it - members.begin());
  info->one_host = true;
  bool shm = shm_ != nullptr && members.size() >= 2 && members.size() <= kShmMaxRanks;
  for (int m : members) {
    if (host_keys_[static_cast<size_t>(m)] != host_keys_[static_cast<size_t>(rank_)])
      info->one_host = false;
    shm = shm && shm_ok_[static_cast<size_t>(m)] != 0;
  }
  shm = shm && info->one_host;
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t index = group_counts_[members]++;
  uint64_t h = mix(0x74726f757065ull, members.size());
  for (int m : members) h = mix(h, static_cast<uint64_t>(m));
  h = mix(h, index);
  info->id = h;
  info->tag_id = static_cast<uint32_t>((h ^ (h >> kTagGroupBits) ^ (h >> (2 * kTagGroupBits))) &
                                       ((1u << kTagGroupBits) - 1));
  if (live_tag_ids_.count(info->tag_id) != 0) {
    return Status::error(
        "ucx group: its tag id collides with another live group of rank " + std::to_string(rank_) +
        " (a one-in-millions accident of hashing); destroy the other group first or create "
        "the groups in another order");
  }
  live_tag_ids_.insert(info->tag_id);
  if (shm) {
    info->channel =
        std::make_shared<ShmChannel>(info->id, info->members, info->rank, options_.shm_slot_bytes);
  }
  return std::shared_ptr<const GroupInfo>(std::move(info));
}

void Engine::release_group(const GroupInfo& group) {
  if (group.channel != nullptr && shm_ != nullptr) shm_->release(group.id, *group.channel);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_tag_ids_.find(group.tag_id);
  if (it != live_tag_ids_.end()) live_tag_ids_.erase(it);
}

WorkPtr Engine::submit(std::unique_ptr<Op> op) {
  WorkPtr work = op->work();
  live_ops_.fetch_add(1);
  {
    std::lock_guard<std::mutex> lock(mu_);
    submitted_.push_back(std::move(op));
  }
  // Start it right here when nobody drives (no hand-off to the progress thread); the progress
  // thread sleeps on the armed worker and wakes for whatever this leaves in flight.
  std::unique_lock<std::timed_mutex> lk(drive_mu_, std::try_to_lock);
  if (lk.owns_lock() && !stop_.load(std::memory_order_acquire)) {
    if (shm_) shm_->set_asleep(false);
    pump();
    going_idle();
    // A waiter asleep on the event fd may have had its work completed by this pump.
    if (drivers_waiting_.load() > 0) ucp_worker_signal(worker_);
  } else {
    ucp_worker_signal(worker_);  // safe from any thread; wakes whoever sleeps on the event fd
  }
  return work;
}

// ------------------------------------------------------------------------------------------------
// Engine: requests (progress thread)

void Engine::complete_msg(Msg* m, ucs_status_t status, size_t length) {
  m->req = nullptr;
  m->called = true;
  m->status = status;
  m->length = length;
  completions_.push_back(m);
}

void Engine::send_cb(void* req, ucs_status_t status, void* user_data) {
  auto* m = static_cast<Msg*>(user_data);
  ucp_request_free(req);
  m->op->engine_.complete_msg(m, status, m->expected);
}

void Engine::recv_cb(void* req, ucs_status_t status, const ucp_tag_recv_info_t* info,
                     void* user_data) {
  auto* m = static_cast<Msg*>(user_data);
  ucp_request_free(req);
  // On truncation UCX reports the sender's length too (what a mismatch message names).
  const bool sized = status == UCS_OK || status == UCS_ERR_MESSAGE_TRUNCATED;
  m->op->engine_.complete_msg(m, status, sized && info != nullptr ? info->length : 0);
}

void Engine::am_data_cb(void* req, ucs_status_t status, size_t length, void* user_data) {
  auto* m = static_cast<Msg*>(user_data);
  ucp_request_free(req);
  m->op->engine_.complete_msg(m, status, length);
}

void Engine::post_tag_send(Msg* m, const void* buf, size_t bytes, uint64_t tag) {
  if (peer_state_[static_cast<size_t>(m->peer)] != PeerState::alive) {
    complete_msg(m, UCS_ERR_NOT_CONNECTED, 0);
    return;
  }
  static const char empty = 0;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = &Engine::send_cb;
  p.user_data = m;
  ucs_status_ptr_t r =
      ucp_tag_send_nbx(eps_[static_cast<size_t>(m->peer)], bytes ? buf : &empty, bytes, tag, &p);
  if (r == nullptr) {
    complete_msg(m, UCS_OK, bytes);
  } else if (UCS_PTR_IS_ERR(r)) {
    complete_msg(m, UCS_PTR_STATUS(r), 0);
  } else if (!m->called) {  // a callback may already have run (and freed r)
    m->req = r;
  }
}

void Engine::post_tag_recv(Msg* m, void* buf, size_t bytes, uint64_t tag) {
  const PeerState state = peer_state_[static_cast<size_t>(m->peer)];
  if (state == PeerState::failed) {
    complete_msg(m, UCS_ERR_NOT_CONNECTED, 0);
    return;
  }
  if (state == PeerState::departed) {
    // A departed rank flushed everything before saying goodbye: its message is here or never comes.
    ucp_tag_recv_info_t info{};
    if (ucp_tag_probe_nb(worker_, tag, ~0ull, 0, &info) == nullptr) {
      complete_msg(m, UCS_ERR_NOT_CONNECTED, 0);
      return;
    }
  }
  static char sink = 0;
  ucp_request_param_t p{};
  // UCX 1.13 leaves recv_info unset on immediate completion, so deny it: the callback reports the
  // received length, which catches ranks that disagree on a count.
  p.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  p.cb.recv = &Engine::recv_cb;
  p.user_data = m;
  ucs_status_ptr_t r = ucp_tag_recv_nbx(worker_, bytes ? buf : &sink, bytes, tag, ~0ull, &p);
  if (UCS_PTR_IS_ERR(r)) {
    complete_msg(m, UCS_PTR_STATUS(r), 0);
  } else if (r != nullptr && !m->called) {
    m->req = r;
  }
}

void Engine::post_am_send(Msg* m, const P2PHeader& header, const void* buf, size_t bytes) {
  if (peer_state_[static_cast<size_t>(m->peer)] != PeerState::alive) {
    complete_msg(m, UCS_ERR_NOT_CONNECTED, 0);
    return;
  }
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = &Engine::send_cb;
  p.user_data = m;
  // `header` lives in the op until the send completes (UCX 1.13 keeps the pointer).
  ucs_status_ptr_t r = ucp_am_send_nbx(eps_[static_cast<size_t>(m->peer)], kAmP2P, &header,
                                       sizeof header, buf, bytes, &p);
  if (r == nullptr) {
    complete_msg(m, UCS_OK, bytes);
  } else if (UCS_PTR_IS_ERR(r)) {
    complete_msg(m, UCS_PTR_STATUS(r), 0);
  } else if (!m->called) {  // a callback may already have run (and freed r)
    m->req = r;
  }
}

void Engine::post_am_recv_data(Msg* m, void* desc, void* buf, size_t bytes) {
  size_t length = 0;
  ucp_request_param_t p{};
  p.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_RECV_INFO;
  p.cb.recv_am = &Engine::am_data_cb;
  p.user_data = m;
  p.recv_info.length = &length;
  ucs_status_ptr_t r = ucp_am_recv_data_nbx(worker_, desc, buf, bytes, &p);
  if (r == nullptr) {
    complete_msg(m, UCS_OK, length);
  } else if (UCS_PTR_IS_ERR(r)) {
    complete_msg(m, UCS_PTR_STATUS(r), 0);
  } else if (!m->called) {  // a callback may already have run (and freed r)
    m->req = r;
  }
}

void Engine::cancel(Msg* m) {
  if (m->req != nullptr) ucp_request_cancel(worker_, m->req);
}

Status Engine::peer_status(int r) const {
  switch (peer_state_[static_cast<size_t>(r)]) {
    case PeerState::alive:
      return Status::ok();
    case PeerState::failed:
      return Status::error(peer_reason_[static_cast<size_t>(r)]);
    case PeerState::departed:
      return Status::error(
          who(r) +
          " destroyed its ucx world before this rank got what it needed from it; every member "
          "must make the same calls in the same order before destroying its world");
  }
  return Status::ok();
}

void* Engine::acquire_slot() {
  if (!free_slots_.empty()) {
    void* s = free_slots_.back();
    free_slots_.pop_back();
    return s;
  }
  const size_t bytes = (options_.chunk_bytes + 63) / 64 * 64;
  void* s = std::aligned_alloc(64, bytes);
  TROUPE_CHECK(s != nullptr,
               "out of host memory for ucx chunk buffers; lower TROUPE_UCX_CHUNK_BYTES");
  all_slots_.push_back(s);
  return s;
}

void Engine::release_slot(void* slot) {
  free_slots_.push_back(slot);
}

// ------------------------------------------------------------------------------------------------
// Engine: the progress thread

void Engine::reap(Op* op) {
  if (op->finished()) {
    ops_.erase(op->self);
    live_ops_.fetch_sub(1);
  }
}

bool Engine::pump() {
  bool did = false;
  std::vector<std::unique_ptr<Op>> batch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    batch.swap(submitted_);
  }
  for (auto& op : batch) {
    Op* raw = op.get();
    ops_.push_back(std::move(op));
    raw->self = std::prev(ops_.end());
    if (stopping_) {
      raw->fail(Status::error(raw->name() + ": the ucx world was destroyed"));
    } else {
      raw->begin();
    }
    reap(raw);
    did = true;
  }
  for (int i = 0; i < 1000 && ucp_worker_progress(worker_) != 0; ++i) did = true;
  while (!completions_.empty()) {
    std::vector<Msg*> done;
    done.swap(completions_);
    for (Msg* m : done) {
      Op* op = m->op;
      op->deliver(m);
      reap(op);
    }
    did = true;
  }
  // Goodbyes before endpoint errors: a peer that closes after saying goodbye has not failed.
  if (!controls_.empty()) {
    auto events = std::move(controls_);
    controls_.clear();
    for (const ControlEvent& e : events) handle_control(e);
    did = true;
  }
  if (!ep_errors_.empty()) {
    auto errors = std::move(ep_errors_);
    ep_errors_.clear();
    for (auto& [r, status] : errors) handle_peer_error(r, status);
    did = true;
  }
  if (!arrivals_.empty()) {
    process_arrivals();
    did = true;
  }
  if (!pollers_.empty() && poll_shm()) did = true;
  for (size_t i = 0; i < closing_.size();) {
    if (ucp_request_check_status(closing_[i]) != UCS_INPROGRESS) {
      ucp_request_free(closing_[i]);
      closing_[i] = closing_.back();
      closing_.pop_back();
      did = true;
    } else {
      ++i;
    }
  }
  return did;
}

void Engine::drive(std::unique_lock<std::timed_mutex>& lk, const std::function<bool()>& done,
                   int sleep_ms, std::chrono::microseconds spin) {
  int idle = 0;
  auto idle_since = std::chrono::steady_clock::now();
  if (shm_ != nullptr) shm_->set_asleep(false);
  while (!done()) {
    if (pump()) {
      idle = 0;
      periodic_checks();  // busy for long stretches: still look at watched peers now and then
      continue;
    }
    if (idle == 0) idle_since = std::chrono::steady_clock::now();
    if (++idle < kIdleSpins) continue;
    if (std::chrono::steady_clock::now() - idle_since < spin) {
      sched_yield();  // a waiter polls a little before sleeping, yielding to ranks on its core
      continue;
    }
    const ucs_status_t st = ucp_worker_arm(worker_);
    if (st == UCS_ERR_BUSY) continue;  // events arrived meanwhile
    if (done()) break;
    // Shared-memory work in flight: peers wake us through the flag; what they published before
    // they could see it is caught by this last look.
    if (!pollers_.empty() && shm_ != nullptr) {
      shm_->set_asleep(true);
      if (poll_shm()) {
        shm_->set_asleep(false);
        idle = 0;
        continue;
      }
    }
    // Sleep until UCX has an event, a watched peer exits, or the timeout (a safety net) passes,
    // without the token so another thread may drive meanwhile. If arming is unsupported, poll
    // briefly instead of spinning a core.
    std::vector<pollfd> fds = wait_fds();
    lk.unlock();
    (void)::poll(fds.data(), fds.size(), st == UCS_OK ? sleep_ms : 1);
    lk.lock();
    if (shm_ != nullptr) shm_->set_asleep(false);
    handle_watch(fds);
    periodic_checks();
    idle = 0;
  }
  going_idle();
}

void Engine::going_idle() {
  if (shm_ == nullptr || pollers_.empty()) return;
  shm_->set_asleep(true);
  poll_shm();
}

bool Engine::poll_shm() {
  bool did = false;
  const std::vector<Op*> snapshot = pollers_;
  for (Op* op : snapshot) {
    if (std::find(pollers_.begin(), pollers_.end(), op) == pollers_.end()) continue;
    if (op->poll()) did = true;
    reap(op);
  }
  return did;
}

void Engine::add_poller(Op* op) {
  if (std::find(pollers_.begin(), pollers_.end(), op) == pollers_.end()) pollers_.push_back(op);
}

void Engine::remove_poller(Op* op) {
  auto it = std::find(pollers_.begin(), pollers_.end(), op);
  if (it != pollers_.end()) pollers_.erase(it);
}

void Engine::adopt(std::unique_ptr<Op> op) {
  Op* raw = op.get();
  live_ops_.fetch_add(1);
  ops_.push_back(std::move(op));
  raw->self = std::prev(ops_.end());
  raw->begin();
  reap(raw);
}

Result<char*> Engine::shm_own_area(uint64_t group_id, size_t bytes) {
  return shm_->own_area(group_id, bytes);
}

int Engine::shm_find_area(int world_rank, uint64_t group_id, char** area) const {
  return shm_->find_area(world_rank, group_id, area);
}

void Engine::shm_notify(const std::vector<int>& members) {
  for (int q : members) {
    if (q != rank_ && peer_state_[static_cast<size_t>(q)] == PeerState::alive &&
        shm_->take_asleep(q))
      send_control(q, kControlWake, rank_);
  }
}

Status Engine::setup_shm(Bootstrap& bootstrap, int index,
                         const std::vector<std::string>& identities) {
  // Map every same-host peer's segment, then tell everyone whether that worked: a group uses
  // shared memory only if all its members could (and so every member decides alike).
  std::string verdict = "1";
  const std::string& my_host = host_keys_[static_cast<size_t>(rank_)];
  size_t local = 0;
  for (int r = 0; r < size_; ++r) {
    if (host_keys_[static_cast<size_t>(r)] != my_host) continue;
    ++local;
    if (r == rank_ || shm_ == nullptr) continue;
    const std::string& id = identities[static_cast<size_t>(r)];
    const std::string desc = identity_field(id, "shm");
    Status s = desc == "-" ? Status::error("rank " + std::to_string(r) + " has no segment")
                           : shm_->attach(r, desc, std::atol(identity_field(id, "pid").c_str()));
    if (!s.is_ok() && verdict == "1")
      verdict = "0 rank " + std::to_string(rank_) + ": " + s.message();
  }
  if (shm_ == nullptr) verdict = "0 rank " + std::to_string(rank_) + ": no segment";
  local_ranks_ = std::max<size_t>(local, 1);
  fault_point(rank_, "attach");
  auto gathered = bootstrap.all_gather("ucx/world" + std::to_string(index) + "/shm", verdict);
  if (!gathered.is_ok())
    return gathered.status().with_context("exchanging shared-memory verdicts: ");
  shm_ok_.assign(static_cast<size_t>(size_), 0);
  std::string refused;
  for (int r = 0; r < size_; ++r) {
    const std::string& v = gathered.value()[static_cast<size_t>(r)];
    shm_ok_[static_cast<size_t>(r)] = v == "1";
    if (v != "1" && refused.empty()) refused = v.size() > 2 ? v.substr(2) : v;
  }
  if (options_.shm == UcxShm::require && !refused.empty()) {
    return Status::error("TROUPE_UCX_SHM=require, but shared memory is unusable (" + refused +
                         "); set TROUPE_UCX_SHM=on to fall back to UCX");
  }
  if (shm_ != nullptr && shm_ok_[static_cast<size_t>(rank_)] == 0) shm_.reset();
  stream_bytes_ = last_level_cache_bytes();
  return Status::ok();
}

void Engine::drive_until(WorkState& work) {
  drivers_waiting_.fetch_add(1);
  while (!work.done() && !stop_.load(std::memory_order_acquire)) {
    // The progress thread hands the token over within one pump; another waiter keeps it until its
    // own work is done, which may complete ours meanwhile, so look again now and then.
    std::unique_lock<std::timed_mutex> lk(drive_mu_, std::defer_lock);
    if (!lk.try_lock_for(std::chrono::microseconds(500))) continue;
    // With other waiters around, sleep briefly: one of them may complete our work without an event.
    drive(
        lk, [&] { return work.done() || stop_.load(std::memory_order_acquire); },
        drivers_waiting_.load() > 1 ? 1 : kPollTimeoutMs,
        std::chrono::microseconds(BackgroundWaits::active() ? 0 : options_.spin_us));
  }
  if (drivers_waiting_.fetch_sub(1) == 1) {
    { std::lock_guard<std::mutex> lock(idle_mu_); }
    idle_cv_.notify_all();
    // Operations still in flight are the progress thread's again; wake it to re-arm the worker.
    if (live_ops_.load() > 0) ucp_worker_signal(worker_);
  } else {
    ucp_worker_signal(worker_);  // other waiters may sleep on the event fd with their work done
  }
}

void Engine::run() {
  for (;;) {
    if (stop_.load(std::memory_order_acquire)) break;
    if (drivers_waiting_.load() > 0) {
      std::unique_lock<std::mutex> lock(idle_mu_);
      idle_cv_.wait_for(lock, std::chrono::milliseconds(kPollTimeoutMs),
                        [&] { return drivers_waiting_.load() == 0 || stop_.load(); });
      continue;
    }
    std::unique_lock<std::timed_mutex> lk(drive_mu_);
    // In the background (callers computing) the progress thread does not spin: it would take their
    // core.
    drive(
        lk, [&] { return stop_.load(std::memory_order_acquire) || drivers_waiting_.load() > 0; },
        kPollTimeoutMs, std::chrono::microseconds(0));
  }
  std::unique_lock<std::timed_mutex> lk(drive_mu_);
  shutdown_network();
}

bool Engine::wait_request(void* req, double seconds) {
  if (req == nullptr) return true;
  if (UCS_PTR_IS_ERR(req)) return true;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (ucp_request_check_status(req) == UCS_INPROGRESS) {
    if (std::chrono::steady_clock::now() > deadline)
      return false;  // leaks req; the worker goes next
    if (!pump()) std::this_thread::yield();
  }
  ucp_request_free(req);
  return true;
}

void Engine::shutdown_network() {
  stopping_ = true;
  // Operations still running now were abandoned by their callers.
  for (auto& op : ops_) op->fail(Status::error(op->name() + ": the ucx world was destroyed"));
  auto pending = [&] {
    for (auto& op : ops_) {
      if (!op->completed_) return true;
    }
    return false;
  };
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  pump();
  while (pending() && std::chrono::steady_clock::now() < deadline) {
    abandon_stale_failures();
    if (!pump()) std::this_thread::yield();
  }
  // Messages nobody will receive (left over from failed operations, or sent by peers that failed
  // meanwhile): take them out of UCX's unexpected queue, which otherwise warns about each one at
  // ucp_worker_destroy. Again after the endpoints are closed (what arrived during the flush).
  std::vector<char> sink;
  auto drain_unexpected = [&] {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
    while (std::chrono::steady_clock::now() < until) {
      ucp_tag_recv_info_t info{};
      ucp_tag_message_h msg = ucp_tag_probe_nb(worker_, 0, 0, 1, &info);
      if (msg == nullptr) break;
      sink.resize(std::max<size_t>(info.length, 1));
      ucp_request_param_t p{};
      wait_request(ucp_tag_msg_recv_nbx(worker_, sink.data(), info.length, msg, &p), 0.2);
    }
  };
  drain_unexpected();
  // Say goodbye first, so peers do not take our exit for a failure. The goodbye travels behind
  // everything we sent on that endpoint, and closing an endpoint without FORCE flushes it.
  for (int q = 0; q < size_; ++q) {
    if (q != rank_ && peer_state_[static_cast<size_t>(q)] == PeerState::alive)
      send_control(q, kControlBye, rank_);
  }
  for (int q = 0; q < size_; ++q) {
    ucp_ep_h ep = eps_[static_cast<size_t>(q)];
    if (ep == nullptr) continue;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = peer_state_[static_cast<size_t>(q)] == PeerState::alive ? 0 : UCP_EP_CLOSE_FLAG_FORCE;
    void* req = ucp_ep_close_nbx(ep, &p);
    if (req != nullptr && !UCS_PTR_IS_ERR(req)) closing_.push_back(req);
    eps_[static_cast<size_t>(q)] = nullptr;
  }
  deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (!closing_.empty() && std::chrono::steady_clock::now() < deadline) {
    if (!pump()) std::this_thread::yield();
  }
  drain_unexpected();
}

}  // namespace troupe::comm::ucx
