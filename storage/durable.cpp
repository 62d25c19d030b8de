#include "storage/durable.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace troupe {

namespace fs = std::filesystem;

std::string parent_dir(const std::string& path) {
  const fs::path p = fs::path(path).parent_path();
  return p.empty() ? "." : p.string();
}

Status fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (directory ? O_DIRECTORY : 0));
  if (fd < 0)
    return Status::error("cannot open " + path + " to fsync it: " + std::strerror(errno) +
                         " -- check its permissions");
  const int r = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (r != 0)
    return Status::error("fsync of " + path + " failed: " + std::strerror(err) +
                         " -- check the disk (full or failing?) and save again");
  return Status::ok();
}

// The second half of the recipe: the data of `tmp` reaches the disk before its new name does.
Status commit_file(const std::string& tmp, const std::string& final_path) {
  TROUPE_RETURN_IF_ERROR(fsync_path(tmp, false));
  std::error_code ec;
  fs::rename(tmp, final_path, ec);
  if (ec)
    return Status::error("cannot rename " + tmp + " to " + final_path + ": " + ec.message() +
                         " -- check the directory's permissions");
  return fsync_path(parent_dir(final_path), true);
}

Status write_text_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return Status::error("cannot create " + tmp + ": " + std::strerror(errno) +
                         " -- check that the directory is writable");
  const ssize_t n = ::write(fd, text.data(), text.size());
  const int err = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(text.size()))
    return Status::error("cannot write " + tmp + ": " + std::strerror(err) +
                         " -- check free disk space");
  return commit_file(tmp, path);
}

}  // namespace troupe
