// Shared-memory segments of the ucx backend (layout and protocol in comm/ucx/ucx_shm.hpp).
#include "comm/ucx/ucx_shm.hpp"
#include "comm/ucx/ucx_detail.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

namespace troupe::comm::ucx {

namespace {

constexpr uint64_t kMagic = 0x74726f7570657368ull;  // "troupesh"
constexpr uint32_t kVersion = 1;
constexpr size_t kDirOffset = 4096;
constexpr size_t kDataOffset = 64 << 10;  // after the header page and the directory

size_t round_up(size_t x, size_t to) {
  return (x + to - 1) / to * to;
}

using detail::mix;

std::string errno_text() {
  return std::strerror(errno);
}

}  // namespace

struct ShmWorld::Header {
  uint64_t magic;
  uint32_t version;
  int32_t rank;
  int64_t pid;
  uint64_t nonce;
  uint64_t bytes;
  alignas(64) std::atomic<uint32_t> asleep;
};

struct ShmWorld::DirEntry {
  std::atomic<uint64_t> group_id;  // 0: free
  std::atomic<uint64_t> offset;
  std::atomic<uint64_t> bytes;  // 0: the owner has no area for this group
  uint64_t unused;
};

static_assert(kDirOffset + kDirEntries * 32 <= kDataOffset);

AreaLayout::AreaLayout(int p_, size_t slot_bytes_) : p(p_), slot_bytes(slot_bytes_) {
  ctl_bytes = round_up(sizeof(LaneHead) + 2 * static_cast<size_t>(p) * sizeof(ShmWord), 4096);
  lane_bytes = ctl_bytes + static_cast<size_t>(p) * slot_bytes;
}

uint64_t ShmChannel::token(uint64_t seq) const {
  return mix(group_id, seq) | 1;
}

bool ShmChannel::lane_free(int lane) {
  LaneUse& u = lanes[lane];
  if (u.token == 0) return true;
  for (int q = 0; q < size(); ++q) {
    if (q == rank || ((u.readers >> q) & 1) == 0) continue;
    if (u.need_in && ack_in(rank, lane, q)->v.load(std::memory_order_acquire) != u.token)
      return false;
    if (u.need_out && ack_out(rank, lane, q)->v.load(std::memory_order_acquire) != u.token)
      return false;
  }
  u = LaneUse{};
  return true;
}

ShmWorld::ShmWorld(int rank, int world_size)
    : rank_(rank),
      bases_(static_cast<size_t>(world_size), nullptr),
      sizes_(static_cast<size_t>(world_size), 0) {}

Result<std::unique_ptr<ShmWorld>> ShmWorld::create(int rank, int world_size, size_t bytes) {
  std::unique_ptr<ShmWorld> w(new ShmWorld(rank, world_size));
  std::random_device rd;
  w->nonce_ = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(::getpid());
  w->bytes_ = std::max(round_up(bytes, 4096), kDataOffset + (1 << 20));
  // An anonymous file: it has no name anywhere, so nothing can outlive the processes that hold it,
  // whenever and however they end (SIGKILL included). Peers open it as /proc/<pid>/fd/<fd>.
  w->fd_ = ::memfd_create("troupe-ucx", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (w->fd_ < 0) return Status::error("memfd_create failed: " + errno_text());
  // The segment is sparse; only the header and directory are backed now (areas when allocated).
  // Its size is sealed, so no process can shrink it under a mapping (which would mean SIGBUS).
  if (::ftruncate(w->fd_, static_cast<off_t>(w->bytes_)) != 0 ||
      ::fcntl(w->fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0 ||
      ::posix_fallocate(w->fd_, 0, static_cast<off_t>(kDataOffset)) != 0) {
    return Status::error("sizing the shared-memory segment failed: " + errno_text() +
                         " (out of memory?)");
  }
  void* base = ::mmap(nullptr, w->bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, w->fd_, 0);
  if (base == MAP_FAILED)
    return Status::error("mapping the shared-memory segment failed: " + errno_text());
  w->bases_[static_cast<size_t>(rank)] = static_cast<char*>(base);
  w->sizes_[static_cast<size_t>(rank)] = w->bytes_;
  Header* h = w->header(rank);
  h->magic = kMagic;
  h->version = kVersion;
  h->rank = rank;
  h->pid = ::getpid();
  h->nonce = w->nonce_;
  h->bytes = w->bytes_;
  h->asleep.store(0);
  DirEntry* dir = w->directory(rank);
  for (int i = 0; i < kDirEntries; ++i) dir[i].group_id.store(0);
  w->free_[kDataOffset] = w->bytes_ - kDataOffset;
  return w;
}

ShmWorld::~ShmWorld() {
  for (size_t r = 0; r < bases_.size(); ++r) {
    if (bases_[r] != nullptr) ::munmap(bases_[r], sizes_[r]);
  }
  if (fd_ >= 0) ::close(fd_);
}

std::string ShmWorld::descriptor() const {
  return "fd" + std::to_string(fd_) + ":" + std::to_string(nonce_);
}

Status ShmWorld::attach(int r, const std::string& descriptor, long pid) {
  const size_t colon = descriptor.find(':');
  if (descriptor.rfind("fd", 0) != 0 || colon == std::string::npos)
    return Status::error("malformed segment descriptor '" + descriptor + "'");
  const int owner_fd = std::atoi(descriptor.c_str() + 2);
  const uint64_t nonce = std::strtoull(descriptor.c_str() + colon + 1, nullptr, 10);
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(owner_fd);
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    std::string why = path + ": " + std::strerror(err);
    if (err == EACCES || err == EPERM) {
      why +=
          " (opening another process's file through /proc needs the same user and group, and "
          "the process must be dumpable; ranks of one host must run as one user)";
    } else if (err == ENOENT) {
      why += " (rank " + std::to_string(r) + "'s process has exited)";
    }
    return Status::error("opening rank " + std::to_string(r) + "'s shared-memory segment " + why);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(kDataOffset)) {
    ::close(fd);
    return Status::error(path + " is too small or unreadable: not rank " + std::to_string(r) +
                         "'s segment");
  }
  const size_t bytes = static_cast<size_t>(st.st_size);
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) return Status::error("mapping " + path + " failed: " + errno_text());
  const auto* h = static_cast<const Header*>(base);
  if (h->magic != kMagic || h->version != kVersion || h->rank != r || h->pid != pid ||
      h->nonce != nonce || h->bytes != bytes) {
    ::munmap(base, bytes);
    return Status::error(path + " is not rank " + std::to_string(r) +
                         "'s segment (another /proc, or a reused process id?)");
  }
  bases_[static_cast<size_t>(r)] = static_cast<char*>(base);
  sizes_[static_cast<size_t>(r)] = bytes;
  return Status::ok();
}

ShmWorld::DirEntry* ShmWorld::directory(int r) const {
  return reinterpret_cast<DirEntry*>(bases_[static_cast<size_t>(r)] + kDirOffset);
}

void ShmWorld::reclaim() {
  for (size_t i = 0; i < quarantine_.size();) {
    Quarantined& q = quarantine_[i];
    bool done = true;
    for (auto& [word, tok] : q.acks) done = done && word->v.load(std::memory_order_acquire) == tok;
    if (!done) {
      ++i;
      continue;
    }
    // Back to the free list, merged with its neighbours.
    size_t off = q.offset, len = q.bytes;
    auto next = free_.lower_bound(off);
    if (next != free_.end() && off + len == next->first) {
      len += next->second;
      next = free_.erase(next);
    }
    if (next != free_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == off) {
        off = prev->first;
        len += prev->second;
        free_.erase(prev);
      }
    }
    free_[off] = len;
    quarantine_[i] = std::move(quarantine_.back());
    quarantine_.pop_back();
  }
}

Result<char*> ShmWorld::own_area(uint64_t group_id, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  char* base = bases_[static_cast<size_t>(rank_)];
  if (auto it = owned_.find(group_id); it != owned_.end())
    return it->second.second == 0 ? nullptr : base + it->second.first;
  DirEntry* dir = directory(rank_);
  int slot = -1;
  for (int i = 0; i < kDirEntries && slot < 0; ++i) {
    if (dir[i].group_id.load(std::memory_order_relaxed) == 0) slot = i;
  }
  if (slot < 0) {
    return Status::error("this rank has " + std::to_string(kDirEntries) +
                         " live groups with shared-memory areas already; destroy unused "
                         "communicators or set TROUPE_UCX_SHM=off");
  }
  reclaim();
  bytes = round_up(bytes, 4096);
  size_t offset = 0, got = 0;
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < bytes) continue;
    offset = it->first;
    const size_t rest = it->second - bytes;
    free_.erase(it);
    if (rest > 0) free_[offset + bytes] = rest;
    got = bytes;
    break;
  }
  if (got != 0 &&
      ::posix_fallocate(fd_, static_cast<off_t>(offset), static_cast<off_t>(got)) != 0) {
    free_[offset] = got;  // out of memory: publish "no area" (merging is left to reclaim)
    got = 0;
  }
  owned_[group_id] = {got == 0 ? 0 : offset, got};
  dir[slot].offset.store(got == 0 ? 0 : offset, std::memory_order_relaxed);
  dir[slot].bytes.store(got, std::memory_order_relaxed);
  dir[slot].group_id.store(group_id, std::memory_order_release);
  return got == 0 ? nullptr : static_cast<char*>(base + offset);
}

void ShmWorld::release(uint64_t group_id, const ShmChannel& channel) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = owned_.find(group_id);
  if (it == owned_.end()) return;
  DirEntry* dir = directory(rank_);
  for (int i = 0; i < kDirEntries; ++i) {
    if (dir[i].group_id.load(std::memory_order_relaxed) == group_id) {
      dir[i].group_id.store(0, std::memory_order_release);
      break;
    }
  }
  const auto [offset, bytes] = it->second;
  owned_.erase(it);
  if (bytes == 0) return;
  // Readers may still be copying the last chunks out of it: wait for their acknowledgements.
  Quarantined q{offset, bytes, {}};
  if (channel.state == ShmChannel::State::ready) {
    for (int lane = 0; lane < kShmLanes; ++lane) {
      const ShmChannel::LaneUse& u = channel.lanes[lane];
      if (u.token == 0) continue;
      for (int r = 0; r < channel.size(); ++r) {
        if (r == channel.rank) continue;
        if (u.need_in) q.acks.emplace_back(channel.ack_in(channel.rank, lane, r), u.token);
        if (u.need_out) q.acks.emplace_back(channel.ack_out(channel.rank, lane, r), u.token);
      }
    }
  } else if (channel.state == ShmChannel::State::broken) {
    return;  // readers' state unknown: never reuse it
  }
  quarantine_.push_back(std::move(q));
  reclaim();
}

int ShmWorld::find_area(int r, uint64_t group_id, char** area) const {
  const DirEntry* dir = directory(r);
  for (int i = 0; i < kDirEntries; ++i) {
    if (dir[i].group_id.load(std::memory_order_acquire) != group_id) continue;
    const uint64_t offset = dir[i].offset.load(std::memory_order_relaxed);
    const uint64_t bytes = dir[i].bytes.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (dir[i].group_id.load(std::memory_order_relaxed) != group_id) continue;  // reused meanwhile
    if (bytes == 0) return -1;
    if (offset + bytes > sizes_[static_cast<size_t>(r)]) return -1;
    *area = bases_[static_cast<size_t>(r)] + offset;
    return 1;
  }
  return 0;
}

void ShmWorld::set_asleep(bool asleep) {
  header(rank_)->asleep.store(asleep ? 1 : 0, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

bool ShmWorld::take_asleep(int r) {
  if (bases_[static_cast<size_t>(r)] == nullptr) return false;
  std::atomic<uint32_t>& flag = header(r)->asleep;
  return flag.load(std::memory_order_relaxed) != 0 && flag.exchange(0) != 0;
}

}  // namespace troupe::comm::ucx
