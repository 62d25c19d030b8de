// engine/buffer_recycler.hpp.
#include "engine/buffer_recycler.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <new>
#include <set>
#include <vector>


namespace troupe {

namespace {

struct Mapping {
  void* base = nullptr;
  size_t bytes = 0;
  ~Mapping() {
    if (base != nullptr) ::munmap(base, bytes);
  }
};

// A kept shard file. live: a snapshot's (or waiting for its iteration to go); shelved: mapped, its
// places handed out; writing: the writer is making it the next shard; dropped: let go.
struct KeptFile {
  enum class State { live, shelved, writing, dropped };
  std::string link;
  std::vector<ShardRegion> regions;
  std::shared_ptr<Mapping> map;
  std::set<std::pair<uint64_t, uint64_t>> free;  // (bytes, offset) of the places not handed out
  State state = State::live;
};

}  // namespace

struct BufferRecycler::Shelf {
  mutable std::mutex mutex;
  std::multimap<int64_t, void*> free;  // bytes -> block
  int64_t bytes = 0, reused = 0, from_files = 0;
  bool open = true;
  std::vector<std::shared_ptr<KeptFile>> files;  // oldest first, at most kMaxFiles
  bool swept = false;                            // a dead process's links removed

  static constexpr size_t kMaxFiles = 2;

  void free_heap() {
    for (auto& [n, block] : free) std::free(block);
    free.clear();
    bytes = 0;
  }
  void drop(const std::shared_ptr<KeptFile>& f) {
    if (f->state != KeptFile::State::dropped) ::unlink(f->link.c_str());
    f->state = KeptFile::State::dropped;
    f->free.clear();
    files.erase(std::remove(files.begin(), files.end(), f), files.end());
  }
  // A live file whose iteration is gone (the link its only name) is mapped and its places shelved.
  void shelve_released_files() {
    for (const std::shared_ptr<KeptFile>& f : std::vector<std::shared_ptr<KeptFile>>(files)) {
      if (f->state != KeptFile::State::live) continue;
      struct stat st {};
      if (::lstat(f->link.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
        drop(f);
        continue;
      }
      if (st.st_nlink != 1) continue;  // still a snapshot's
      free_heap();  // the files serve from now on (freed before mapping: not both resident at once)
      if (f->map == nullptr || f->map->bytes != static_cast<size_t>(st.st_size)) {
        const int fd = ::open(f->link.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
        void* base = fd < 0 ? MAP_FAILED
                            : ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE,
                                     MAP_SHARED | MAP_POPULATE, fd, 0);
        if (fd >= 0) ::close(fd);
        if (base == MAP_FAILED) {
          drop(f);
          continue;
        }
        f->map = std::make_shared<Mapping>();
        f->map->base = base, f->map->bytes = static_cast<size_t>(st.st_size);
      }
      f->free.clear();
      for (const ShardRegion& r : f->regions)
        if (r.offset + r.bytes <= f->map->bytes) f->free.insert({r.bytes, r.offset});
      f->state = KeptFile::State::shelved;
    }
  }
  // The link name for a new kept file of `path` (…/iter_N/shard_R.h5): beside the iteration folders.
  std::string new_link(const std::string& path) {
    const std::filesystem::path shard(path);
    const std::filesystem::path dir = shard.parent_path().parent_path() / ".recycle";
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    const std::string mine = shard.filename().string() + "." + std::to_string(::getpid()) + ".";
    if (!swept) {  // links left by processes that are gone (killed before they let them go)
      swept = true;
      const std::string shard_prefix = shard.filename().string() + ".";
      for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
        const std::string name = e.path().filename().string();
        if (name.rfind(mine, 0) == 0) continue;
        // This shard's are another process's (that process is gone: the shard is this one's now);
        // others' when their process no longer runs ("<shard>.<pid>.<n>").
        if (name.rfind(shard_prefix, 0) == 0 || kept_link_orphaned(name)) std::filesystem::remove(e.path(), ec);
      }
    }
    // Numbered over the process, not the recycler: an attempt's recycler may still hold its names
    // when the next attempt's takes its first.
    static std::atomic<uint64_t> names{0};
    return (dir / (mine + std::to_string(names.fetch_add(1)))).string();
  }
};

bool kept_link_orphaned(const std::string& name) {
  const size_t last = name.rfind('.');
  const size_t pid_at = last == std::string::npos || last == 0 ? std::string::npos : name.rfind('.', last - 1);
  const long pid = pid_at == std::string::npos ? 0 : std::strtol(name.c_str() + pid_at + 1, nullptr, 10);
  return pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
}

BufferRecycler::BufferRecycler() : shelf_(std::make_shared<Shelf>()) {}

BufferRecycler::~BufferRecycler() {
  std::lock_guard<std::mutex> lock(shelf_->mutex);
  shelf_->open = false;
  shelf_->free_heap();
  while (!shelf_->files.empty()) shelf_->drop(shelf_->files.front());
}

Tensor BufferRecycler::take(const Shape& shape, DType dtype) {
  const int64_t bytes = std::max<int64_t>(1, shape.numel() * static_cast<int64_t>(dtype_size(dtype)));
  void* block = nullptr;
  {
    std::lock_guard<std::mutex> lock(shelf_->mutex);
    shelf_->shelve_released_files();
    for (const std::shared_ptr<KeptFile>& f : shelf_->files) {
      if (f->state != KeptFile::State::shelved) continue;
      auto it = f->free.lower_bound({static_cast<uint64_t>(bytes), 0});
      if (it == f->free.end() || it->first != static_cast<uint64_t>(bytes)) continue;
      const uint64_t offset = it->second;
      f->free.erase(it);
      ++shelf_->from_files;
      // Back among the file's places when the last view goes, unless the file became a snapshot.
      std::shared_ptr<void> owner(static_cast<uint8_t*>(f->map->base) + offset,
                                  [shelf = shelf_, f, map = f->map, bytes, offset](void*) {
                                    std::lock_guard<std::mutex> lock(shelf->mutex);
                                    if (f->state == KeptFile::State::shelved && f->map == map)
                                      f->free.insert({static_cast<uint64_t>(bytes), offset});
                                  });
      return Tensor::wrap(static_cast<uint8_t*>(f->map->base) + offset, shape, dtype, std::move(owner));
    }
    if (auto it = shelf_->free.find(bytes); it != shelf_->free.end()) {
      block = it->second;
      shelf_->free.erase(it);
      shelf_->bytes -= bytes;
      ++shelf_->reused;
    }
  }
  if (block == nullptr) {
    block = std::aligned_alloc(64, static_cast<size_t>((bytes + 63) / 64 * 64));
    if (block == nullptr) throw std::bad_alloc();
  }
  // Back on the shelf when the last view goes (from whichever thread: the offload writer's), or
  // freed when the recycler is gone.
  std::shared_ptr<void> owner(block, [shelf = shelf_, bytes](void* p) {
    std::lock_guard<std::mutex> lock(shelf->mutex);
    if (!shelf->open) {
      std::free(p);
      return;
    }
    shelf->free.emplace(bytes, p);
    shelf->bytes += bytes;
  });
  return Tensor::wrap(block, shape, dtype, std::move(owner));
}

int64_t BufferRecycler::shelved_bytes() const {
  std::lock_guard<std::mutex> lock(shelf_->mutex);
  return shelf_->bytes;
}

int64_t BufferRecycler::reused() const {
  std::lock_guard<std::mutex> lock(shelf_->mutex);
  return shelf_->reused;
}

int64_t BufferRecycler::from_files() const {
  std::lock_guard<std::mutex> lock(shelf_->mutex);
  return shelf_->from_files;
}

std::optional<ShardFileReuse> BufferRecycler::file_holding(const ShardContents& contents) {
  std::lock_guard<std::mutex> lock(shelf_->mutex);
  for (const std::shared_ptr<KeptFile>& f : shelf_->files) {
    if (f->state != KeptFile::State::shelved) continue;
    const auto* lo = static_cast<const uint8_t*>(f->map->base);
    const auto* hi = lo + f->map->bytes;
    for (const auto& [section, pieces] : contents.sections)
      for (const TensorPiece& p : pieces) {
        const auto* at = static_cast<const uint8_t*>(p.values.raw());
        if (std::less_equal<const uint8_t*>()(lo, at) && std::less<const uint8_t*>()(at, hi)) {
          f->state = KeptFile::State::writing;
          return ShardFileReuse{f->link, lo, f->map->bytes, f->regions};
        }
      }
  }
  return std::nullopt;
}

void BufferRecycler::after_write(const std::string& path, bool ok, const ShardWriteStats& stats,
                                 const std::optional<ShardFileReuse>& reuse) {
  std::lock_guard<std::mutex> lock(shelf_->mutex);
  if (!shelf_->open) return;
  std::shared_ptr<KeptFile> used;
  if (reuse)
    for (const std::shared_ptr<KeptFile>& f : shelf_->files)
      if (f->state == KeptFile::State::writing && f->link == reuse->path) used = f;
  if (used != nullptr) {
    if (ok && stats.in_place) {  // the file is the new shard now: keep it under its name again
      if (::link(path.c_str(), used->link.c_str()) != 0) {
        used->state = KeptFile::State::dropped;  // nothing to unlink
        shelf_->drop(used);
        return;
      }
      used->regions = stats.reserved;
      used->free.clear();
      used->state = KeptFile::State::live;
      return;
    }
    struct stat st {};
    if (::lstat(used->link.c_str(), &st) == 0) {
      used->state = KeptFile::State::shelved;  // not used: its places come back as the pieces go
    } else {
      used->state = KeptFile::State::dropped;
      shelf_->drop(used);
    }
  }
  if (!ok || stats.in_place || stats.reserved.empty()) return;
  auto kept = std::make_shared<KeptFile>();
  kept->link = shelf_->new_link(path);
  ::unlink(kept->link.c_str());
  if (::link(path.c_str(), kept->link.c_str()) != 0) return;
  kept->regions = stats.reserved;
  shelf_->files.push_back(kept);
  while (shelf_->files.size() > Shelf::kMaxFiles) {
    auto oldest = std::find_if(shelf_->files.begin(), shelf_->files.end(),
                               [](const auto& f) { return f->state != KeptFile::State::writing; });
    if (oldest == shelf_->files.end() || *oldest == kept) break;
    shelf_->drop(*oldest);
  }
}

}  // namespace troupe
