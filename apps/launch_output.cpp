#include "apps/launch_output.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace troupe::apps {

namespace {

std::string errno_text() { return std::strerror(errno); }

void write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;  // a full disk loses log lines, not the job
    p += w;
    n -= static_cast<size_t>(w);
  }
}

}  // namespace

Result<StreamEnds> open_stream(const StreamPlan& plan) {
  StreamEnds e;
  if (!plan.file.empty()) {
    e.file_fd = ::open(plan.file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (e.file_fd < 0) return Status::error("cannot create the log file " + plan.file + ": " + errno_text());
  }
  const bool copy = plan.console ? (!plan.prefix.empty() || e.file_fd >= 0) : false;
  if (!copy) {
    if (e.file_fd >= 0) {  // the file only: the rank writes it itself
      e.child_fd = e.file_fd;
      e.file_fd = -1;
    } else if (!plan.console) {  // nowhere
      e.child_fd = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
      if (e.child_fd < 0) return Status::error("cannot open /dev/null: " + errno_text());
    }
    return e;
  }
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    if (e.file_fd >= 0) ::close(e.file_fd);
    return Status::error("pipe: " + errno_text());
  }
  e.read_fd = fds[0];
  e.child_fd = fds[1];
  return e;
}

Result<std::string> make_run_log_dir(const std::string& base, const std::string& id) {
  std::error_code ec;
  std::string root = base;
  if (root.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/torchelastic_XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr)
      return Status::error("cannot make a folder for the ranks' logs (" + tmpl + "): " + errno_text() +
                           " -- give --log-dir DIR");
    root = tmpl;
  } else {
    std::filesystem::create_directories(root, ec);
    if (!std::filesystem::is_directory(root))
      return Status::bad_input("--log-dir " + base + ": cannot make the folder (" +
                               (ec ? ec.message() : std::string("a file is in the way")) + ") -- give a folder");
  }
  std::string tmpl = root + "/" + id + "_XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr)
    return Status::bad_input("--log-dir " + root + ": cannot make a folder there (" + errno_text() +
                             ") -- give a folder this user may write");
  return tmpl;
}

Result<std::string> make_attempt_dir(const std::string& run_dir, int attempt, int local_ranks) {
  const std::string dir = run_dir + "/attempt_" + std::to_string(attempt);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  for (int r = 0; r < local_ranks; ++r) {
    std::filesystem::create_directories(dir + "/" + std::to_string(r), ec);
    if (ec) return Status::error("cannot make the log folder " + dir + "/" + std::to_string(r) + ": " + ec.message());
  }
  return dir;
}

OutputRouter::~OutputRouter() { finish(std::chrono::milliseconds(0)); }

void OutputRouter::add(const StreamEnds& ends, FILE* console, const std::string& prefix) {
  if (ends.read_fd < 0) return;
  streams_.push_back({ends.read_fd, ends.file_fd, console, prefix, {}});
}

void OutputRouter::start() {
  if (!streams_.empty()) thread_ = std::thread([this] { run(); });
}

void OutputRouter::finish(std::chrono::milliseconds grace) {
  if (thread_.joinable()) {
    const auto deadline = std::chrono::steady_clock::now() + grace;
    while (!done_ && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    stop_ = true;
    thread_.join();
  }
  for (auto& s : streams_) {
    if (s.fd >= 0) ::close(s.fd);
    if (s.file_fd >= 0) ::close(s.file_fd);
    s.fd = s.file_fd = -1;
  }
}

void OutputRouter::emit(Stream& s, const std::string& text) {
  if (s.console == nullptr) return;
  std::fprintf(s.console, "%s%s", s.prefix.c_str(), text.c_str());
  std::fflush(s.console);
}

void OutputRouter::run() {
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<Stream*> which;
    for (auto& s : streams_)
      if (s.fd >= 0) {
        fds.push_back({s.fd, POLLIN, 0});
        which.push_back(&s);
      }
    if (fds.empty() || stop_) break;
    if (poll(fds.data(), fds.size(), 100) <= 0) continue;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Stream& s = *which[i];
      char buf[4096];
      const ssize_t n = ::read(s.fd, buf, sizeof buf);
      if (n <= 0) {
        if (n < 0 && errno == EINTR) continue;
        if (!s.partial.empty()) emit(s, s.partial + "\n");
        ::close(s.fd);
        s.fd = -1;
        continue;
      }
      if (s.file_fd >= 0) write_all(s.file_fd, buf, static_cast<size_t>(n));
      s.partial.append(buf, static_cast<size_t>(n));
      size_t nl;
      while ((nl = s.partial.find('\n')) != std::string::npos) {
        emit(s, s.partial.substr(0, nl + 1));
        s.partial.erase(0, nl + 1);
      }
    }
  }
  done_ = true;
}

}  // namespace troupe::apps
