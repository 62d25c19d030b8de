// Files that survive a crash, and the one place where checkpoint bytes reach the file system. Every
// checkpoint file (shards, version-1 files, metadata.json, the latest pointer, Hugging Face
// exports) is written by write_file_atomically: PATH.tmp created anew (O_EXCL | O_NOFOLLOW, mode
// 0600: a planted file or symlink is replaced, never followed), written, fsync'd, renamed over
// PATH, the directory fsync'd. After a crash at any moment PATH holds the old or the new content,
// never a torn file; after a failure (a full disk, an I/O error, a read-only folder) PATH.tmp is
// removed and PATH is untouched.
//
// Fault injection (tests; leveldb's fault_injection_test): the operations below are counted per
// process by kind, and an IoFault makes the nth one of a kind fail with an errno, optionally every
// later one too (a disk that stays full). set_io_fault installs one; otherwise it is read once from
// TROUPE_FAULT_IO=OP@N[+]:ERRNO (OP: create, write, fsync, rename, mkdir; ERRNO: ENOSPC, EIO,
// EROFS, EACCES, EDQUOT; "+" = sticky), never in a process that `troupe launch` restarted.
//
// Errors name the path, the system's reason and the fix (free space, check the disk, make the
// folder writable). Thread-safe.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "troupe/status.hpp"

namespace troupe {

enum class FileOp : uint8_t { create, write, fsync, rename, mkdir };

struct IoFault {
  FileOp op = FileOp::write;
  int64_t nth = 1;      // 1: the first such operation from now on
  int error = 0;        // errno to fail with
  bool sticky = false;  // every later operation of that kind fails too
};
// Installs (or with nullopt removes) the fault and restarts the counts; overrides TROUPE_FAULT_IO.
void set_io_fault(std::optional<IoFault> fault);
// Parses "write@3+:ENOSPC"; an error names what is wrong.
Result<IoFault> parse_io_fault(const std::string& spec);

// The directory part of a path ("." when it has none).
std::string parent_dir(const std::string& path);
// fsync of a file or (directory = true) a directory.
Status fsync_path(const std::string& path, bool directory);
// The second half of the recipe: the data of `tmp` reaches the disk before its new name does.
Status commit_file(const std::string& tmp, const std::string& final_path);
// Creates a directory and its missing parents.
Status make_directories(const std::string& path);

// Bytes to write, in order, without copying them into one buffer.
struct ConstBytes {
  const void* data = nullptr;
  size_t size = 0;
};
// The whole recipe (see the top) for `pieces` written one after the other, in blocks of at most
// kPacedBlockBytes with this thread's write pacing (storage/write_pacing.hpp) after each.
Status write_file_atomically(const std::string& path, const std::vector<ConstBytes>& pieces);
// A stretch of a file being written: bytes to copy, that many zero bytes, or bytes already in place
// (a file rewritten where it lies, rewrite_file_with_head).
struct FileStretch {
  enum class Kind : uint8_t { bytes, zeros, in_place };
  Kind kind = Kind::bytes;
  const void* data = nullptr;  // bytes only
  size_t size = 0;
};
// The same for a file whose first `head_bytes` bytes depend on all the others (a header with their
// checksum): `body`'s stretches are written one after the other from offset head_bytes on (no
// in_place ones), then `make_head()` -- exactly head_bytes bytes -- at offset 0, before the fsync.
Status write_file_with_head(const std::string& path, size_t head_bytes, const std::vector<FileStretch>& body,
                            const std::function<std::string()>& make_head);
// The same recipe on a file of this process's that no checkpoint refers to any more (`existing`: an
// in-memory snapshot's shard whose iteration was dropped, and whose pages the next snapshot was
// copied into where that snapshot's pieces go): it is renamed to PATH.tmp, written there (in_place
// stretches skipped), cut to its new length, fsync'd and renamed to PATH. On failure PATH.tmp is
// removed; `existing` is gone either way.
Status rewrite_file_with_head(const std::string& path, const std::string& existing, size_t head_bytes,
                              const std::vector<FileStretch>& body, const std::function<std::string()>& make_head);
// Reads a whole regular file of at most max_bytes (metadata.json, the latest pointer) without
// blocking on a FIFO or a device planted at `path`. Errors: missing, not a regular file or too
// large are bad input; a failing read is a run-time error.
Result<std::string> read_small_file(const std::string& path, size_t max_bytes);
// A small text file (metadata.json, the latest pointer).
Status write_text_atomically(const std::string& path, const std::string& text);

// A file written through a mapping of it (a copy received from another process lands in its pages
// directly, no buffer between): PATH.tmp created anew (as write_file_atomically does) with `bytes`
// bytes reserved (posix_fallocate: a full tmpfs is an error naming the room, never a SIGBUS when a
// store reaches a page that cannot be had), mapped read-write; commit() makes it PATH (mode, fsync, rename, the folder's fsync). Gone
// uncommitted (or after a failed commit), PATH.tmp is removed and PATH untouched. Setting its
// length counts as a write for fault injection. Movable, not thread-safe.
class MappedFileWrite {
 public:
  static Result<MappedFileWrite> create(const std::string& path, uint64_t bytes);
  // The same into the pages of `existing`, a file of this process's that nothing refers to any more
  // (a snapshot copy whose iteration was dropped: engine/snapshot_copies.hpp): it is renamed to
  // PATH.tmp, cut or grown (and what it grew by reserved) to `bytes` and mapped with its pages in place, so receiving into it
  // neither faults nor clears a page per 4 KiB. Its old bytes are there until overwritten. On
  // failure `existing` is gone (removed) and nothing is left at PATH.tmp.
  static Result<MappedFileWrite> reuse(const std::string& path, const std::string& existing, uint64_t bytes);
  MappedFileWrite(MappedFileWrite&& other) noexcept;
  MappedFileWrite& operator=(MappedFileWrite&& other) noexcept;
  ~MappedFileWrite();
  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  Status commit();

 private:
  MappedFileWrite() = default;
  void abandon();
  // Maps the open temporary (`populate`: its pages already there); on failure abandons it.
  Status map(bool populate);
  std::string path_;
  int fd_ = -1;
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

// A whole regular file of at most max_bytes, mapped read-only (a snapshot's shard sent to another
// process without reading it into memory first). Not-regular files and larger ones are refused as
// read_small_file refuses them. Movable.
class MappedFileRead {
 public:
  static Result<MappedFileRead> open(const std::string& path, uint64_t max_bytes);
  MappedFileRead(MappedFileRead&& other) noexcept;
  MappedFileRead& operator=(MappedFileRead&& other) noexcept;
  ~MappedFileRead();
  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  MappedFileRead() = default;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

// A log file that grows by appends (TensorBoard's event files), outside the recipe above: created
// anew and exclusively (O_EXCL | O_NOFOLLOW: a name already taken fails, nothing is followed or
// truncated), mode 0644 less the umask. Each append is written whole (short writes resumed) or
// fails; there is no fsync: what was appended survives a crash of the process, the page cache's
// share of it not a crash of the machine. Counted as create and write for fault injection. Closed
// by the destructor; movable, not thread-safe.
class AppendOnlyFile {
 public:
  // *name_taken (when given) says whether the failure was an existing `path`.
  static Result<AppendOnlyFile> create(const std::string& path, bool* name_taken = nullptr);
  AppendOnlyFile(AppendOnlyFile&& other) noexcept;
  AppendOnlyFile& operator=(AppendOnlyFile&& other) noexcept;
  AppendOnlyFile(const AppendOnlyFile&) = delete;
  AppendOnlyFile& operator=(const AppendOnlyFile&) = delete;
  ~AppendOnlyFile();
  Status append(const void* data, size_t size);
  const std::string& path() const { return path_; }

 private:
  AppendOnlyFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::string path_;
};

}  // namespace troupe
