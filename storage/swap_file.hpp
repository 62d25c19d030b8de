// A scratch file that holds state swapped out of memory (--offload-optimizer nvme: the Adam
// moments), read and written in page-aligned pieces by the file's own I/O thread, so reading the
// next pieces overlaps the compute on this one (read-ahead) and writes go back behind it
// (write-back).
//
// The file is opened with O_DIRECT where the file system allows it (the data goes to the disk and
// does not stay in the page cache); elsewhere (tmpfs, some network file systems) it is buffered and
// each written range is dropped from the cache afterwards (posix_fadvise DONTNEED). Its whole size
// is reserved at creation (posix_fallocate), so a full disk is a clear error at the start, never a
// failed write in the middle of a step; the reserved space reads as zeros. The file has no name
// (O_TMPFILE; where the file system lacks it, a random name created with O_EXCL | O_NOFOLLOW and
// unlinked at once), mode 0600: no other user can open it, a symlink planted at `dir/name` is never
// followed, and nothing is left behind when the process ends, however it ends.
//
// Transfers run in the order they were queued. Offsets, sizes and buffers must be multiples of
// kAlign. Thread-safe; the destructor waits for queued transfers.
#pragma once
#include <cstdint>
#include <future>
#include <memory>
#include <string>

#include "troupe/status.hpp"

namespace troupe {

class SwapFile {
 public:
  static constexpr int64_t kAlign = 4096;

  // In `dir`, `bytes` (a multiple of kAlign) reserved; `name` labels it in messages (path()).
  // Errors name the path and the fix (no directory, no space, no permission).
  static Result<std::unique_ptr<SwapFile>> create(const std::string& dir, const std::string& name,
                                                  int64_t bytes);
  ~SwapFile();
  SwapFile(const SwapFile&) = delete;
  SwapFile& operator=(const SwapFile&) = delete;

  std::future<Status> read(int64_t offset, void* dst, int64_t bytes);
  std::future<Status> write(int64_t offset, const void* src, int64_t bytes);

  const std::string& path() const;
  int64_t size() const;
  bool direct() const;  // O_DIRECT (else buffered with the cache dropped after writes)

 private:
  struct Impl;
  explicit SwapFile(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe
