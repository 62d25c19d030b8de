// Every seed (fuzz/corpus/<target>/) and every input a fuzzer found a problem with
// (fuzz/regressions/<target>/) through the fuzz target's own entry point, in the normal build:
// each must come back as a Status -- accepted, or refused with a message -- never a crash, an
// abort (a failed property of the target) or an exception. One test case per target.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz/fuzz_targets.hpp"
#include "tests/test_util.hpp"

namespace fs = std::filesystem;

namespace {

using Entry = troupe::Status (*)(const uint8_t*, size_t);

std::vector<fs::path> files_in(const fs::path& dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

void run_inputs(const std::string& target, Entry entry) {
  const fs::path root = fs::path(troupe::test::source_dir()) / "fuzz";
  const std::vector<fs::path> seeds = files_in(root / "corpus" / target);
  CHECK_FALSE(seeds.empty());  // every target has seeds
  std::vector<fs::path> inputs = seeds;
  for (const fs::path& p : files_in(root / "regressions" / target)) inputs.push_back(p);
  int accepted = 0;
  for (const fs::path& path : inputs) {
    std::ifstream in(path, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    INFO(path.string());
    const troupe::Status st = entry(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    if (st.is_ok()) {
      ++accepted;
    } else {
      CHECK_FALSE(st.message().empty());
      CHECK(st.message().find("json.exception") == std::string::npos);  // explained, not relayed
    }
  }
  // So the seeds reach past the first check: at least one is a valid input.
  CHECK(accepted > 0);
}

}  // namespace

#define TROUPE_FUZZ_TEST(name)                                                             \
  TEST_CASE("fuzz inputs: " #name " takes its corpus and regressions cleanly", "[fuzz]") { \
    run_inputs(#name, &troupe::fuzz::name);                                                \
  }
TROUPE_FUZZ_TARGETS(TROUPE_FUZZ_TEST)
