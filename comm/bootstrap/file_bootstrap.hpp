// FileBootstrap: a Bootstrap over a directory every rank can see (one machine's /tmp, or a shared
// filesystem such as NFS or Lustre), like torch.distributed's FileStore. No server, no ports: used
// by tests and by jobs whose ranks share a filesystem.
//
//   auto boot = FileBootstrap::create("/shared/job42", rank, world_size).value();
//   auto world = create_ucx_world(*boot).value();
//
// Protocol: all_gather(key, blob) on rank r writes DIR/<key>.<r> (written to a temporary name, then
// renamed, so a reader never sees half a file), then polls until the files of all ranks exist
// (sleeping 1 ms, growing to 20 ms between looks) and reads them. Each file starts with a one-line
// header "troupe-file-bootstrap 1 <world_size>\n" so ranks started with different world sizes fail
// instead of mixing. Keys are escaped into file names (anything but [A-Za-z0-9._-] becomes %XX), so
// any key works. When rank r finishes a key, every rank has written that key, so all ranks are done
// reading r's file of the key before: r deletes it then. The files of the last key stay (nobody can
// tell when the others finished reading them); remove the directory after the job.
//
// Failure modes: a rank that does not write its file within options.timeout makes all_gather /
// barrier fail with an error naming the missing ranks and the directory (nothing waits for ever).
// Stale files from an earlier job in the same directory are mistaken for this job's: use a fresh
// directory per job. I/O errors (directory not writable, disk full) are reported with the path.
//
// Thread safety: one FileBootstrap is used by one thread at a time. Different ranks are different
// objects (usually different processes).
#pragma once
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "comm/bootstrap.hpp"
#include "troupe/status.hpp"

namespace troupe::comm {

struct FileBootstrapOptions {
  // Longest wait for the other ranks' files in one all_gather / barrier.
  std::chrono::milliseconds timeout{std::chrono::seconds(120)};
};

class FileBootstrap final : public Bootstrap {
 public:
  // dir is created if missing. Fails on world_size < 1, rank outside [0, world_size) or an unusable
  // directory.
  static Result<std::unique_ptr<FileBootstrap>> create(const std::string& dir, int rank,
                                                       int world_size,
                                                       FileBootstrapOptions options = {});

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  Result<std::vector<std::string>> all_gather(const std::string& key,
                                              const std::string& mine) override;
  Status barrier(const std::string& key) override;

 private:
  FileBootstrap(std::string dir, int rank, int world_size, FileBootstrapOptions options)
      : dir_(std::move(dir)), rank_(rank), world_size_(world_size), options_(options) {}
  std::string path_of(const std::string& escaped_key, int rank) const;

  std::string dir_;
  int rank_;
  int world_size_;
  FileBootstrapOptions options_;
  std::string
      previous_key_;  // escaped; this rank's file of it is deleted after the next key completes
};

}  // namespace troupe::comm
