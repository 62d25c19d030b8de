#include "storage/temp_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>

namespace troupe {

Result<TempFile> create_temp_file(const std::string& base, int extra_flags) {
  static constexpr char kChars[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string path;
  for (int attempt = 0; attempt < 100; ++attempt) {
    path = base + ".tmp.";
    for (int i = 0; i < 8; ++i) path += kChars[rng() % (sizeof(kChars) - 1)];
    const int fd = ::open(path.c_str(),
                          O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | extra_flags, 0600);
    if (fd >= 0) return TempFile{fd, path};
    if (errno != EEXIST) {
      return Status::error(path + ": cannot create (" + std::strerror(errno) +
                           ") -- check that the directory exists and is writable");
    }
  }
  return Status::error(path + ": cannot create a temporary file: 100 random names were taken -- " +
                       "clear the stale *.tmp.* files in that directory");
}

mode_t default_file_mode() {
  // Linux 4.7+ reports the umask in /proc/self/status; reading it leaves the umask alone (umask()
  // would change it for every thread while it is read).
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Umask:", 0) == 0)
      return 0666 & ~static_cast<mode_t>(std::strtoul(line.c_str() + 6, nullptr, 8));
  }
  return 0644;  // the usual umask 022
}

}  // namespace troupe
