// Swap files (--offload-optimizer nvme) against a planted symlink: the file is created without a
// name anyone could plant (O_TMPFILE, or O_EXCL | O_NOFOLLOW with a random name), mode 0600, so a
// symlink at the name the job announces never sends the data to its target (issue 10: the old
// O_CREAT | O_TRUNC open followed it and overwrote the target).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "storage/swap_file.hpp"
#include "tests/test_util.hpp"

namespace fs = std::filesystem;
using troupe::SwapFile;

namespace {

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The mode of the descriptor this process holds on a deleted file in `dir`, found through
// /proc/self/fd (the swap file has no name to stat).
int swap_fd_mode(const fs::path& dir) {
  for (const auto& e : fs::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const fs::path target = fs::read_symlink(e.path(), ec);
    if (ec || target.string().rfind(dir.string() + "/", 0) != 0) continue;
    struct stat st {};
    if (::stat(e.path().c_str(), &st) == 0 && S_ISREG(st.st_mode)) return st.st_mode & 07777;
  }
  return -1;
}

}  // namespace

TEST_CASE("swap file: a planted symlink is not followed; the file is 0600 and nameless",
          "[swap_file]") {
  troupe::test::TempDir dir;
  const fs::path victim = dir.path() / "victim.txt";
  const std::string precious = "precious data, must stay\n";
  std::ofstream(victim) << precious;
  const std::string name = "troupe-optimizer-rank0-pid" + std::to_string(::getpid()) + ".swap";
  fs::create_symlink(victim, dir.path() / name);

  auto swap = SwapFile::create(dir.str(), name, 4 * SwapFile::kAlign);
  REQUIRE(swap.is_ok());
  // The swap file works: a page written reads back.
  void* out = nullptr;
  void* in = nullptr;
  REQUIRE(::posix_memalign(&out, SwapFile::kAlign, SwapFile::kAlign) == 0);
  REQUIRE(::posix_memalign(&in, SwapFile::kAlign, SwapFile::kAlign) == 0);
  std::memset(out, 0x5a, SwapFile::kAlign);
  REQUIRE((*swap)->write(SwapFile::kAlign, out, SwapFile::kAlign).get().is_ok());
  REQUIRE((*swap)->read(SwapFile::kAlign, in, SwapFile::kAlign).get().is_ok());
  CHECK(std::memcmp(in, out, SwapFile::kAlign) == 0);
  CHECK(swap_fd_mode(dir.path()) == 0600);

  // Nothing went through the symlink, which is still there and still points at the victim; no
  // other file appeared in the directory.
  CHECK(read_all(victim) == precious);
  CHECK(fs::is_symlink(dir.path() / name));
  CHECK(fs::read_symlink(dir.path() / name) == victim);
  CHECK(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()) == 2);
  swap->reset();
  CHECK(read_all(victim) == precious);
  std::free(out);
  std::free(in);
}

TEST_CASE("swap file: an unusable directory is a clear error", "[swap_file]") {
  troupe::test::TempDir dir;
  const fs::path file = dir.path() / "not-a-dir";
  std::ofstream(file) << "x";
  auto r = SwapFile::create(file.string(), "x.swap", SwapFile::kAlign);
  REQUIRE_FALSE(r.is_ok());
  CHECK_THAT(r.status().message(), Catch::Contains("--offload-path") && Catch::Contains("x.swap") &&
                                       Catch::Contains(" -- "));
}
