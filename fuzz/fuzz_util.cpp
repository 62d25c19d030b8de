#include "fuzz/fuzz_util.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "troupe/check.hpp"
#include "storage/tokenizer.hpp"

namespace troupe::fuzz {
namespace {

std::string make_scratch_dir() {
  std::string base = "/dev/shm";
  std::error_code ec;
  if (!std::filesystem::is_directory(base, ec) || ::access(base.c_str(), W_OK) != 0) {
    const char* tmp = std::getenv("TMPDIR");
    base = tmp && *tmp ? tmp : "/tmp";
  }
  std::string templ = base + "/troupe-fuzz-XXXXXX";
  TROUPE_CHECK(::mkdtemp(templ.data()) != nullptr, "cannot create the fuzz scratch directory");
  return templ;
}

struct Scratch {
  std::string dir = make_scratch_dir();
  ~Scratch() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

}  // namespace

const std::string& scratch_dir() {
  static Scratch scratch;
  return scratch.dir;
}

std::string write_scratch(const std::string& name, std::string_view bytes) {
  const std::string path = scratch_dir() + "/" + name;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  TROUPE_CHECK(fd >= 0, "cannot write a fuzz scratch file");
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    TROUPE_CHECK(n > 0, "cannot write a fuzz scratch file");
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return path;
}

std::pair<std::string_view, std::string_view> split_two(const uint8_t* data, size_t size) {
  const auto* chars = reinterpret_cast<const char*>(data);
  if (size < 4) return {std::string_view(), std::string_view(chars, size)};
  uint32_t first = 0;
  std::memcpy(&first, data, 4);
  const size_t n = std::min<size_t>(first, size - 4);
  return {std::string_view(chars + 4, n), std::string_view(chars + 4 + n, size - 4 - n)};
}

std::string join_two(std::string_view first, std::string_view second) {
  const auto n = static_cast<uint32_t>(first.size());
  std::string out(4, '\0');
  std::memcpy(out.data(), &n, 4);
  out.append(first);
  out.append(second);
  return out;
}

void check_round_trip(const Tokenizer& tok, std::string_view text) {
  const std::vector<int32_t> ids = tok.encode(text);
  for (int32_t id : ids)
    TROUPE_CHECK(id >= 0 && id < tok.vocab_size(), "id outside the vocabulary");
  TROUPE_CHECK(tok.decode(ids) == text, "decode(encode(x)) != x");
}

std::string source_path(const std::string& relative) {
  const char* env = std::getenv("TROUPE_SOURCE_DIR");
  return std::string(env && *env ? env : TROUPE_SOURCE_DIR_DEFAULT) + "/" + relative;
}

}  // namespace troupe::fuzz
