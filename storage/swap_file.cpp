#include "storage/swap_file.hpp"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "storage/temp_file.hpp"

namespace troupe {

struct SwapFile::Impl {
  struct Transfer {
    bool write = false;
    int64_t offset = 0, bytes = 0;
    char* data = nullptr;
    std::promise<Status> done;
  };

  std::string path;
  int fd = -1;
  int64_t size = 0;
  bool direct = false;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Transfer> queue;
  bool closing = false;
  std::thread worker;

  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(mu);
      closing = true;
    }
    cv.notify_all();
    if (worker.joinable()) worker.join();
    if (fd >= 0) ::close(fd);
  }

  void run() {
    for (;;) {
      Transfer t;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return closing || !queue.empty(); });
        if (queue.empty()) return;  // closing, and everything queued was done
        t = std::move(queue.front());
        queue.pop_front();
      }
      t.done.set_value(transfer(t));
    }
  }

  Status transfer(const Transfer& t) const {
    int64_t done = 0;
    while (done < t.bytes) {
      const ssize_t n =
          t.write
              ? ::pwrite(fd, t.data + done, static_cast<size_t>(t.bytes - done), t.offset + done)
              : ::pread(fd, t.data + done, static_cast<size_t>(t.bytes - done), t.offset + done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0)
        return Status::error(
            "optimizer swap file " + path + ": " + (t.write ? "write" : "read") + " of " +
            std::to_string(t.bytes) + " bytes at offset " + std::to_string(t.offset) +
            " failed: " + (n == 0 ? std::string("end of file") : std::strerror(errno)) +
            " -- check the disk under --offload-path");
      done += n;
    }
    // Buffered I/O: the data is on its way to the disk; do not let it sit in the page cache too.
    if (t.write && !direct) {
      (void)::fdatasync(fd);
      (void)::posix_fadvise(fd, t.offset, t.bytes, POSIX_FADV_DONTNEED);
    }
    return Status::ok();
  }

  std::future<Status> enqueue(bool write, int64_t offset, char* data, int64_t bytes) {
    Transfer t;
    t.write = write;
    t.offset = offset;
    t.bytes = bytes;
    t.data = data;
    std::future<Status> f = t.done.get_future();
    const bool aligned = offset % kAlign == 0 && bytes % kAlign == 0 &&
                         reinterpret_cast<uintptr_t>(data) % kAlign == 0;
    if (!aligned || offset < 0 || offset + bytes > size) {
      t.done.set_value(Status::error("optimizer swap file " + path + ": transfer of " +
                                     std::to_string(bytes) + " bytes at " + std::to_string(offset) +
                                     " is unaligned or out of range"));
      return f;
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      queue.push_back(std::move(t));
    }
    cv.notify_one();
    return f;
  }
};

SwapFile::SwapFile(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SwapFile::~SwapFile() = default;

Result<std::unique_ptr<SwapFile>> SwapFile::create(const std::string& dir, const std::string& name,
                                                   int64_t bytes) {
  if (bytes < 0 || bytes % kAlign != 0)
    return Status::error("swap file size must be a multiple of 4096");
  auto impl = std::make_unique<Impl>();
  impl->path = dir + "/" + name;
  impl->size = bytes;
  // The file never has a name another user could plant a symlink at or open: O_TMPFILE creates it
  // unnamed in `dir` (mode 0600), so it also vanishes however the process ends. Where the file
  // system lacks O_TMPFILE, a temporary with a random name (O_EXCL | O_NOFOLLOW, 0600: never
  // follows a symlink) is unlinked at once. Either way with O_DIRECT where the file system has it
  // (not tmpfs: EINVAL).
  const auto failed = [&](const std::string& why) {
    return Status::error("--offload-path: cannot create the optimizer swap file " + impl->path +
                         ": " + why + " -- give a writable directory on a local disk");
  };
  for (const bool direct : {true, false}) {
    impl->fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC | (direct ? O_DIRECT : 0), 0600);
    if (impl->fd >= 0) {
      impl->direct = direct;
      break;
    }
    // Anything but "not supported here" is a real failure (no directory, no permission, no space).
    if (errno != EINVAL && errno != EOPNOTSUPP && errno != EISDIR)
      return failed(std::strerror(errno));
  }
  for (const bool direct : {true, false}) {
    if (impl->fd >= 0) break;
    auto tmp = create_temp_file(impl->path, direct ? O_DIRECT : 0);
    if (!tmp) {
      if (direct) continue;  // perhaps only O_DIRECT is refused
      return failed(tmp.status().message());
    }
    impl->fd = tmp->fd;
    impl->direct = direct;
    ::unlink(tmp->path.c_str());  // lives as long as the descriptor: nothing is left behind
  }
  if (bytes > 0) {
    const int err = ::posix_fallocate(impl->fd, 0, bytes);
    if (err != 0) {
      struct statvfs fs {};
      std::string free_text;
      if (::statvfs(dir.c_str(), &fs) == 0)
        free_text =
            ", " +
            std::to_string(static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize) >>
                           20) +
            " MiB free";
      return Status::error("--offload-path " + dir + ": cannot reserve " +
                           std::to_string(bytes >> 20) + " MiB for the optimizer swap file (" +
                           std::strerror(err) + free_text +
                           ") -- free space there or give a directory on a larger disk");
    }
  }
  Impl* raw = impl.get();
  impl->worker = std::thread([raw] { raw->run(); });
  return std::unique_ptr<SwapFile>(new SwapFile(std::move(impl)));
}

std::future<Status> SwapFile::read(int64_t offset, void* dst, int64_t bytes) {
  return impl_->enqueue(false, offset, static_cast<char*>(dst), bytes);
}

std::future<Status> SwapFile::write(int64_t offset, const void* src, int64_t bytes) {
  return impl_->enqueue(true, offset, const_cast<char*>(static_cast<const char*>(src)), bytes);
}

const std::string& SwapFile::path() const {
  return impl_->path;
}
int64_t SwapFile::size() const {
  return impl_->size;
}
bool SwapFile::direct() const {
  return impl_->direct;
}

}  // namespace troupe
