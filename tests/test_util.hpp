// Helpers shared by the Catch2 tests.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>

#include <catch2/catch.hpp>

#include "kernels/device_info.hpp"

namespace troupe::test {

// Catch2 v2 has no skip: under CTest (TROUPE_CTEST=1) a skipped case exits with code 4, which CTest
// reports as "Skipped"; run by hand it warns and returns from the test case.
#define TROUPE_SKIP(reason)                                          \
  do {                                                               \
    if (std::getenv("TROUPE_CTEST")) {                               \
      std::printf("SKIPPED: %s\n", std::string(reason).c_str());     \
      std::fflush(stdout);                                           \
      std::_Exit(4);                                                 \
    }                                                                \
    WARN("skipped: " << (reason));                                   \
    return;                                                          \
  } while (0)

// Skips the test case (CTest reports it skipped) without a usable GPU (label gpu).
#define TROUPE_NEED_GPU()                                                                 \
  do {                                                                                    \
    if (::troupe::query_devices().cuda_devices < 1) TROUPE_SKIP("no usable CUDA device"); \
  } while (0)

inline std::string source_dir() {
  const char* s = std::getenv("TROUPE_SOURCE_DIR");
  return s ? s : TROUPE_SOURCE_DIR_DEFAULT;
}

// A fresh empty directory under the system temp dir, removed by the destructor.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() / ("troupe-test-" + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }
  std::string str(const std::string& name = "") const { return name.empty() ? path_.string() : (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace troupe::test
