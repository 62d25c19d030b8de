#include "storage/durable.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <utility>

#include "storage/write_pacing.hpp"

namespace troupe {

namespace fs = std::filesystem;

namespace {

// ---- fault injection
// -------------------------------------------------------------------------------

struct FaultState {
  std::mutex mu;
  bool initialised = false;
  std::optional<IoFault> fault;
  int64_t counts[5] = {};
};

FaultState& fault_state() {
  static FaultState s;
  return s;
}

bool restarted_process() {
  const char* r = std::getenv("TROUPE_RESTART_COUNT");
  return r != nullptr && std::strtol(r, nullptr, 10) > 0;
}

// The errno the next operation of this kind fails with (0: none).
int injected(FileOp op) {
  FaultState& s = fault_state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.initialised) {
    s.initialised = true;
    const char* spec = std::getenv("TROUPE_FAULT_IO");
    if (spec != nullptr && !restarted_process()) {
      auto f = parse_io_fault(spec);
      if (f) {
        s.fault = f.value();
      } else {
        std::fprintf(stderr, "troupe: ignoring TROUPE_FAULT_IO=%s: %s\n", spec,
                     f.status().message().c_str());
      }
    }
  }
  const int64_t n = ++s.counts[static_cast<int>(op)];
  if (!s.fault || s.fault->op != op) return 0;
  return n == s.fault->nth || (s.fault->sticky && n > s.fault->nth) ? s.fault->error : 0;
}

// "<what>: <reason> -- <fix>" for a failed system call.
Status io_error(const std::string& what, int err) {
  std::string fix;
  switch (err) {
    case ENOSPC:
    case EDQUOT:
      fix = "the disk is full: free space on it (or save to another folder) and save again";
      break;
    case EROFS:
    case EACCES:
    case EPERM:
      fix = "the folder is read-only or not writable: make it writable or save to another folder";
      break;
    case EIO:
      fix = "the disk reported an I/O error: check it (dmesg) and save to another disk";
      break;
    default:
      fix = "check the disk and the folder's permissions";
      break;
  }
  return Status::error(what + ": " + std::strerror(err) + " -- " + fix);
}

// The process's umask, read without changing it (umask(2) would, for every thread).
mode_t process_umask() {
  static const mode_t mask = [] {
    std::ifstream in("/proc/self/status");
    std::string line;
    while (std::getline(in, line))
      if (line.rfind("Umask:", 0) == 0)
        return static_cast<mode_t>(std::strtol(line.c_str() + 6, nullptr, 8));
    return static_cast<mode_t>(022);
  }();
  return mask;
}

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() { close(); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  // 0, or the errno of a failed close (NFS reports write errors there).
  int close() {
    if (fd_ < 0) return 0;
    const int r = ::close(fd_);
    fd_ = -1;
    return r == 0 ? 0 : errno;
  }

 private:
  int fd_;
};

Status write_all(int fd, const void* data, size_t n, const std::string& path) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    if (const int err = injected(FileOp::write)) return io_error("cannot write " + path, err);
    const ssize_t r = ::write(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return io_error("cannot write " + path, errno);
    if (r == 0) return io_error("cannot write " + path, EIO);
    p += r;
    n -= static_cast<size_t>(r);
  }
  return Status::ok();
}

Status fsync_fd(int fd, const std::string& path) {
  int err = injected(FileOp::fsync);
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (err != 0) return io_error("fsync of " + path + " failed", err);
  return Status::ok();
}

Status rename_path(const std::string& from, const std::string& to) {
  int err = injected(FileOp::rename);
  if (err == 0 && ::rename(from.c_str(), to.c_str()) != 0) err = errno;
  if (err != 0) return io_error("cannot rename " + from + " to " + to, err);
  return Status::ok();
}

// A fresh temporary file: a leftover of a crashed save, or a planted file or symlink, is unlinked
// (unlink never follows a link) and the name created anew, exclusively.
Result<int> create_fresh(const std::string& path, int access = O_WRONLY) {
  for (int attempt = 0;; ++attempt) {
    int err = injected(FileOp::create);
    int fd = -1;
    if (err == 0) {
      fd = ::open(path.c_str(), access | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
      if (fd < 0) err = errno;
    }
    if (fd >= 0) return fd;
    if (err == EEXIST && attempt < 3 && (::unlink(path.c_str()) == 0 || errno == ENOENT)) continue;
    return io_error("cannot create " + path, err);
  }
}

}  // namespace

void set_io_fault(std::optional<IoFault> fault) {
  FaultState& s = fault_state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.initialised = true;
  s.fault = fault;
  std::fill(std::begin(s.counts), std::end(s.counts), 0);
}

Result<IoFault> parse_io_fault(const std::string& spec) {
  const size_t at = spec.find('@'), colon = spec.find(':');
  if (at == std::string::npos || colon == std::string::npos || colon < at)
    return Status::bad_input("'" + spec + "' is not OP@N[+]:ERRNO (e.g. write@3+:ENOSPC)");
  IoFault f;
  const std::string op = spec.substr(0, at), count = spec.substr(at + 1, colon - at - 1),
                    err = spec.substr(colon + 1);
  const std::pair<const char*, FileOp> ops[] = {{"create", FileOp::create},
                                                {"write", FileOp::write},
                                                {"fsync", FileOp::fsync},
                                                {"rename", FileOp::rename},
                                                {"mkdir", FileOp::mkdir}};
  bool known = false;
  for (const auto& [name, value] : ops)
    if (op == name) f.op = value, known = true;
  if (!known)
    return Status::bad_input("unknown operation '" + op +
                             "' (create, write, fsync, rename, mkdir)");
  f.sticky = !count.empty() && count.back() == '+';
  char* end = nullptr;
  const std::string digits = f.sticky ? count.substr(0, count.size() - 1) : count;
  f.nth = std::strtoll(digits.c_str(), &end, 10);
  if (digits.empty() || *end != '\0' || f.nth < 1)
    return Status::bad_input("'" + count + "' is not a count >= 1");
  const std::pair<const char*, int> errs[] = {
      {"ENOSPC", ENOSPC}, {"EIO", EIO}, {"EROFS", EROFS}, {"EACCES", EACCES}, {"EDQUOT", EDQUOT}};
  for (const auto& [name, value] : errs)
    if (err == name) f.error = value;
  if (f.error == 0)
    return Status::bad_input("unknown errno '" + err + "' (ENOSPC, EIO, EROFS, EACCES, EDQUOT)");
  return f;
}

std::string parent_dir(const std::string& path) {
  const fs::path p = fs::path(path).parent_path();
  return p.empty() ? "." : p.string();
}

Status fsync_path(const std::string& path, bool directory) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | (directory ? O_DIRECTORY : 0)));
  if (fd.get() < 0) return io_error("cannot open " + path + " to fsync it", errno);
  return fsync_fd(fd.get(), path);
}

Status commit_file(const std::string& tmp, const std::string& final_path) {
  TROUPE_RETURN_IF_ERROR(fsync_path(tmp, false));
  TROUPE_RETURN_IF_ERROR(rename_path(tmp, final_path));
  return fsync_path(parent_dir(final_path), true);
}

Status make_directories(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return Status::ok();
  if (const int err = injected(FileOp::mkdir))
    return io_error("cannot create the folder " + path, err);
  fs::create_directories(path, ec);
  if (ec) return io_error("cannot create the folder " + path, ec.value());
  return Status::ok();
}

namespace {

// "0.88 MiB", "12 KiB", "3.1 GiB".
std::string bytes_text(double bytes) {
  char t[32];
  if (bytes >= 1024.0 * 1024 * 1024) std::snprintf(t, sizeof t, "%.3g GiB", bytes / (1024.0 * 1024 * 1024));
  else if (bytes >= 1024.0 * 1024) std::snprintf(t, sizeof t, "%.3g MiB", bytes / (1024.0 * 1024));
  else std::snprintf(t, sizeof t, "%.0f KiB", std::ceil(bytes / 1024.0));
  return t;
}

// A failed write of `bytes` bytes to `path`: where its disk has less free, both figures (the room the
// user has to make).
Status with_room(const Status& st, const std::string& path, uint64_t bytes) {
  struct statvfs disk {};
  if (::statvfs(parent_dir(path).c_str(), &disk) != 0) return st;
  const double free = static_cast<double>(disk.f_bavail) * static_cast<double>(disk.f_frsize);
  if (free >= static_cast<double>(bytes)) return st;
  return Status::error(st.message() + " (" + path + " needs " + bytes_text(static_cast<double>(bytes)) +
                       "; its disk has " + bytes_text(free) + " free)");
}

// A mapped file's pages reserved before anything is written through the mapping: on a full tmpfs a
// store to a page that cannot be had is a SIGBUS, a reservation that fails is ENOSPC. 0 or errno.
int reserve(int fd, uint64_t from, uint64_t to) {
  if (to <= from) return 0;
  return ::posix_fallocate(fd, static_cast<off_t>(from), static_cast<off_t>(to - from));
}

// The recipe around `write_body(fd, tmp)`: a fresh temporary (or `existing` renamed to it), its mode,
// fsync, rename, the folder's fsync; on failure the temporary goes. `bytes`: what the file will
// hold; a write that fails where the disk has less free says both figures (the room the user has to
// make).
Status write_durably(const std::string& path, uint64_t bytes,
                     const std::function<Status(int, const std::string&)>& write_body,
                     const std::string& existing = "") {
  const std::string tmp = path + ".tmp";
  auto open_existing = [&]() -> Result<int> {
    TROUPE_RETURN_IF_ERROR(rename_path(existing, tmp));
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) return fd;
    const Status st = io_error("cannot open " + tmp, errno);
    ::unlink(tmp.c_str());
    return st;
  };
  Result<int> created = existing.empty() ? create_fresh(tmp) : open_existing();
  if (!created) return created.status();
  Fd fd(created.value());
  auto fail = [&](const Status& st) {
    fd.close();
    ::unlink(tmp.c_str());
    return with_room(st, path, bytes);
  };
  if (Status st = write_body(fd.get(), tmp); !st) return fail(st);
  if (!existing.empty() && ::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0)
    return fail(io_error("cannot set the length of " + tmp, errno));
  if (::fchmod(fd.get(), 0644 & ~process_umask()) != 0)
    return fail(io_error("cannot set the mode of " + tmp, errno));
  if (Status st = fsync_fd(fd.get(), tmp); !st) return fail(st);
  if (const int err = fd.close()) return fail(io_error("cannot write " + tmp, err));
  if (Status st = rename_path(tmp, path); !st) return fail(st);
  return fsync_path(parent_dir(path), true);
}

// Writes `piece` in paced blocks.
Status write_paced(int fd, const std::string& tmp, ConstBytes piece) {
  const std::function<void(double)>* pacer = WritePacing::current();
  const auto* p = static_cast<const char*>(piece.data);
  for (size_t done = 0; done < piece.size;) {
    const size_t n = std::min(kPacedBlockBytes, piece.size - done);
    const double t0 = thread_cpu_seconds();  // the pacer counts work, not waits for a core
    TROUPE_RETURN_IF_ERROR(write_all(fd, p + done, n, tmp));
    done += n;
    if (pacer != nullptr) (*pacer)(thread_cpu_seconds() - t0);
  }
  return Status::ok();
}

}  // namespace

Status write_file_atomically(const std::string& path, const std::vector<ConstBytes>& pieces) {
  uint64_t bytes = 0;
  for (const ConstBytes& piece : pieces) bytes += piece.size;
  return write_durably(path, bytes, [&](int fd, const std::string& tmp) {
    for (const ConstBytes& piece : pieces)
      TROUPE_RETURN_IF_ERROR(write_paced(fd, tmp, piece));
    return Status::ok();
  });
}

namespace {

Status write_with_head(const std::string& path, const std::string& existing, size_t head_bytes,
                       const std::vector<FileStretch>& body, const std::function<std::string()>& make_head) {
  uint64_t bytes = head_bytes;
  for (const FileStretch& s : body) {
    TROUPE_CHECK(existing.size() > 0 || s.kind != FileStretch::Kind::in_place,
                 "write_file_with_head: a new file has no bytes in place");
    bytes += s.size;
  }
  return write_durably(path, bytes, [&](int fd, const std::string& tmp) {
    const std::string zeros(head_bytes, '\0');  // the head's place, written last
    TROUPE_RETURN_IF_ERROR(write_all(fd, zeros.data(), zeros.size(), tmp));
    static const std::vector<char> kZeros(size_t{64} << 10, '\0');
    for (const FileStretch& s : body) {
      switch (s.kind) {
        case FileStretch::Kind::bytes:
          TROUPE_RETURN_IF_ERROR(write_paced(fd, tmp, {s.data, s.size}));
          break;
        case FileStretch::Kind::zeros:
          for (size_t done = 0; done < s.size;) {
            const size_t n = std::min(kZeros.size(), s.size - done);
            TROUPE_RETURN_IF_ERROR(write_paced(fd, tmp, {kZeros.data(), n}));
            done += n;
          }
          break;
        case FileStretch::Kind::in_place:
          if (::lseek(fd, static_cast<off_t>(s.size), SEEK_CUR) < 0) return io_error("cannot seek in " + tmp, errno);
          break;
      }
    }
    const std::string head = make_head();
    TROUPE_CHECK(head.size() == head_bytes, "write_file_with_head: the head has the wrong size");
    if (::lseek(fd, 0, SEEK_SET) != 0) return io_error("cannot seek in " + tmp, errno);
    return write_all(fd, head.data(), head.size(), tmp);
  }, existing);
}

}  // namespace

Status write_file_with_head(const std::string& path, size_t head_bytes, const std::vector<FileStretch>& body,
                            const std::function<std::string()>& make_head) {
  return write_with_head(path, "", head_bytes, body, make_head);
}

Status rewrite_file_with_head(const std::string& path, const std::string& existing, size_t head_bytes,
                              const std::vector<FileStretch>& body, const std::function<std::string()>& make_head) {
  TROUPE_CHECK(!existing.empty(), "rewrite_file_with_head: which file?");
  return write_with_head(path, existing, head_bytes, body, make_head);
}

Result<std::string> read_small_file(const std::string& path, size_t max_bytes) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  if (fd.get() < 0) {
    if (errno == ENOENT) return Status::bad_input(path + " does not exist");
    return io_error("cannot open " + path, errno);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return io_error("cannot read " + path, errno);
  if (!S_ISREG(st.st_mode)) return Status::bad_input(path + " is not a regular file");
  if (static_cast<uint64_t>(st.st_size) > max_bytes)
    return Status::bad_input(path + " has " + std::to_string(st.st_size) +
                             " bytes, more than the " + std::to_string(max_bytes) +
                             " such a file can have");
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t r = ::read(fd.get(), text.data() + got, text.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return io_error("cannot read " + path, errno);
    if (r == 0) break;  // shorter than fstat said (changed meanwhile): what is there
    got += static_cast<size_t>(r);
  }
  text.resize(got);
  return text;
}

Status write_text_atomically(const std::string& path, const std::string& text) {
  return write_file_atomically(path, {{text.data(), text.size()}});
}

Result<MappedFileWrite> MappedFileWrite::create(const std::string& path, uint64_t bytes) {
  MappedFileWrite m;
  m.path_ = path;
  const std::string tmp = path + ".tmp";
  Result<int> created = create_fresh(tmp, O_RDWR);  // read-write: a shared mapping needs both
  if (!created) return created.status();
  m.fd_ = created.value();
  m.size_ = bytes;
  int err = injected(FileOp::write);
  if (err == 0 && ::ftruncate(m.fd_, static_cast<off_t>(bytes)) != 0) err = errno;
  if (err != 0) {
    const Status st = io_error("cannot set the length of " + tmp, err);
    m.abandon();
    return st;
  }
  if (const int room = reserve(m.fd_, 0, bytes); room != 0) {
    const Status st = with_room(io_error("cannot reserve " + std::to_string(bytes) + " bytes for " + tmp, room), path, bytes);
    m.abandon();
    return st;
  }
  TROUPE_RETURN_IF_ERROR(m.map(false));
  return m;
}

Status MappedFileWrite::map(bool populate) {
  if (size_ == 0) return Status::ok();
  void* p = ::mmap(nullptr, static_cast<size_t>(size_), PROT_READ | PROT_WRITE, MAP_SHARED | (populate ? MAP_POPULATE : 0),
                   fd_, 0);
  if (p == MAP_FAILED) {
    const Status st = io_error("cannot map " + path_ + ".tmp", errno);
    abandon();
    return st;
  }
  data_ = static_cast<uint8_t*>(p);
  return Status::ok();
}

Result<MappedFileWrite> MappedFileWrite::reuse(const std::string& path, const std::string& existing, uint64_t bytes) {
  MappedFileWrite m;
  m.path_ = path;
  const std::string tmp = path + ".tmp";
  struct stat st {};
  const int found = ::lstat(existing.c_str(), &st) == 0 ? 0 : errno;
  if (found != 0 || !S_ISREG(st.st_mode)) {
    ::unlink(existing.c_str());
    const int err = found != 0 ? found : EINVAL;
    return io_error("cannot reuse " + existing + (found != 0 ? "" : " (not a regular file)"), err);
  }
  if (Status renamed = rename_path(existing, tmp); !renamed) {
    ::unlink(existing.c_str());
    return renamed;
  }
  m.fd_ = ::open(tmp.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  if (m.fd_ < 0) {
    const Status failed = io_error("cannot open " + tmp, errno);
    ::unlink(tmp.c_str());
    return failed;
  }
  m.size_ = bytes;
  int err = injected(FileOp::write);
  if (err == 0 && static_cast<uint64_t>(st.st_size) != bytes && ::ftruncate(m.fd_, static_cast<off_t>(bytes)) != 0)
    err = errno;
  if (err != 0) {
    const Status failed = io_error("cannot set the length of " + tmp, err);
    m.abandon();
    return failed;
  }
  if (const int room = reserve(m.fd_, static_cast<uint64_t>(st.st_size), bytes); room != 0) {  // what it grew by
    const Status failed =
        with_room(io_error("cannot reserve " + std::to_string(bytes) + " bytes for " + tmp, room), path, bytes);
    m.abandon();
    return failed;
  }
  TROUPE_RETURN_IF_ERROR(m.map(true));
  return m;
}

MappedFileWrite::MappedFileWrite(MappedFileWrite&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)), data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

MappedFileWrite& MappedFileWrite::operator=(MappedFileWrite&& other) noexcept {
  if (this != &other) {
    abandon();
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

MappedFileWrite::~MappedFileWrite() { abandon(); }

void MappedFileWrite::abandon() {
  if (data_ != nullptr) ::munmap(data_, static_cast<size_t>(size_));
  data_ = nullptr;
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink((path_ + ".tmp").c_str());
  }
  fd_ = -1;
}

Status MappedFileWrite::commit() {
  TROUPE_CHECK(fd_ >= 0, "MappedFileWrite::commit: nothing to commit");
  const std::string tmp = path_ + ".tmp";
  Status st = Status::ok();
  if (data_ != nullptr && ::munmap(data_, static_cast<size_t>(size_)) != 0) st = io_error("cannot unmap " + tmp, errno);
  data_ = nullptr;
  if (st && ::fchmod(fd_, 0644 & ~process_umask()) != 0) st = io_error("cannot set the mode of " + tmp, errno);
  if (st) st = fsync_fd(fd_, tmp);
  if (st) {
    const int err = ::close(fd_) == 0 ? 0 : errno;
    fd_ = -1;
    if (err != 0) st = io_error("cannot write " + tmp, err);
  }
  if (st) st = rename_path(tmp, path_);
  if (!st) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    ::unlink(tmp.c_str());
    return st;
  }
  return fsync_path(parent_dir(path_), true);
}

Result<MappedFileRead> MappedFileRead::open(const std::string& path, uint64_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return io_error("cannot open " + path, errno);
  Fd owned(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0) return io_error("cannot read " + path, errno);
  if (!S_ISREG(st.st_mode)) return Status::bad_input(path + " is not a regular file -- remove what is there");
  if (static_cast<uint64_t>(st.st_size) > max_bytes)
    return Status::bad_input(path + " is larger than expected (" + std::to_string(st.st_size) + " bytes)");
  MappedFileRead m;
  m.size_ = static_cast<uint64_t>(st.st_size);
  if (m.size_ > 0) {
    void* p = ::mmap(nullptr, static_cast<size_t>(m.size_), PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return io_error("cannot map " + path, errno);
    m.data_ = static_cast<const uint8_t*>(p);
  }
  return m;
}

MappedFileRead::MappedFileRead(MappedFileRead&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedFileRead& MappedFileRead::operator=(MappedFileRead&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), static_cast<size_t>(size_));
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

MappedFileRead::~MappedFileRead() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), static_cast<size_t>(size_));
}

Result<AppendOnlyFile> AppendOnlyFile::create(const std::string& path, bool* name_taken) {
  if (name_taken) *name_taken = false;
  int err = injected(FileOp::create);
  int fd = -1;
  if (err == 0) {
    fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) err = errno;
  }
  if (fd >= 0) return AppendOnlyFile(fd, path);
  if (name_taken) *name_taken = err == EEXIST;
  return io_error("cannot create " + path, err);
}

AppendOnlyFile::AppendOnlyFile(AppendOnlyFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)) {}

AppendOnlyFile& AppendOnlyFile::operator=(AppendOnlyFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
  }
  return *this;
}

AppendOnlyFile::~AppendOnlyFile() {
  if (fd_ >= 0) ::close(fd_);
}

Status AppendOnlyFile::append(const void* data, size_t size) {
  TROUPE_CHECK(fd_ >= 0, "append to a moved-from AppendOnlyFile");
  return write_all(fd_, data, size, path_);
}

}  // namespace troupe
