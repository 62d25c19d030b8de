// The rendezvous's places and the node's hint file (comm/bootstrap/rendezvous_place.hpp): the
// format round-trips, every malformed hint is refused naming what is wrong, and the file is written
// whole and read bounded.
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>

#include "comm/bootstrap/rendezvous_place.hpp"
#include "tests/test_util.hpp"

namespace troupe::comm {
namespace {

using Catch::Contains;

TEST_CASE("a rendezvous hint round-trips and has one spelling", "[bootstrap]") {
  RendezvousHint h{{"10.77.0.1", 29500, 0}, RendezvousPlace{"10.77.0.2", 29501, 2}};
  const std::string text = encode_hint(h);
  CHECK(text == "troupe-rdzv-hint 1\nat 10.77.0.1 29500 0\nstandby 10.77.0.2 29501 2\n");
  auto back = parse_hint(text);
  REQUIRE(back);
  CHECK(back.value() == h);
  RendezvousHint first{{"host0", 65535, 1 << 30}, std::nullopt};
  auto again = parse_hint(encode_hint(first));
  REQUIRE(again);
  CHECK(again.value() == first);
  CHECK(place_text({"fe80::1", 7, 3}) == "[fe80::1]:7 (rank 3)");
  CHECK(place_text({"10.0.0.5", 29500, 0}) == "10.0.0.5:29500 (rank 0)");
}

TEST_CASE("a malformed rendezvous hint is refused, naming the problem", "[bootstrap]") {
  const std::string head = "troupe-rdzv-hint 1\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "no line end"},
      {head + "at 10.0.0.1 29500 0", "no line end"},
      {head, "not 2 or 3 lines"},
      {"troupe-rdzv-hint 2\nat 10.0.0.1 29500 0\n", "header"},
      {head + "at 10.0.0.1 029500 0\n", "port outside"},
      {head + "at 10.0.0.1 0 0\n", "port outside"},
      {head + "at 10.0.0.1 65536 0\n", "port outside"},
      {head + "at 10.0.0.1 29500 -1\n", "rank outside"},
      {head + "at 10.0.0.1 29500 1073741825\n", "rank outside"},
      {head + "at 10.0.0.1 29500 99999999999\n", "rank outside"},
      {head + "at 10.0.0.1/8 29500 0\n", "an address"},
      {head + "at  29500 0\n", "an address"},
      {head + "at 10.0.0.1 29500 0 \n", "line 2"},
      {head + "standby 10.0.0.1 29500 0\n", "line 2"},
      {head + "at 10.0.0.1 29500 0\nat 10.0.0.2 29501 1\n", "line 3"},
      {head + "at 10.0.0.1 29500 0\nstandby 10.0.0.2 29501 1\nstandby 10.0.0.2 29501 1\n", "not 2 or 3 lines"},
      {head + "at " + std::string(254, 'a') + " 29500 0\n", "an address"},
      {head + "at 10.0.0.1 29500 0\n" + std::string(kMaxHintBytes, '#') + "\n", "more than"},
  };
  for (const auto& [text, problem] : cases) {
    INFO(text.substr(0, 120));
    auto h = parse_hint(text);
    REQUIRE_FALSE(h);
    CHECK(h.status().is_bad_input());
    CHECK_THAT(h.status().message(), Contains(problem) && Contains("TROUPE_RDZV_HINT"));
  }
}

TEST_CASE("the hint file is written whole and read bounded", "[bootstrap]") {
  test::TempDir tmp;
  const auto dir = tmp.path();
  const std::string path = (dir / "hint").string();
  auto none = read_hint(path);
  REQUIRE(none);
  CHECK_FALSE(none.value().has_value());
  RendezvousHint h{{"127.0.0.1", 40000, 0}, RendezvousPlace{"127.0.0.1", 40001, 1}};
  REQUIRE(write_hint(path, h));
  h.standby->rank = 2;
  REQUIRE(write_hint(path, h));  // replaced by rename: no temporary left beside it
  auto got = read_hint(path);
  REQUIRE(got);
  REQUIRE(got.value().has_value());
  CHECK(*got.value() == h);
  size_t files = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++files;
  CHECK(files == 1);
  // A file past the bound is refused without reading it all; a symlink is not followed.
  {
    std::ofstream big(path, std::ios::trunc);
    big << "troupe-rdzv-hint 1\n" << std::string(size_t{1} << 20, 'x');
  }
  auto large = read_hint(path);
  REQUIRE_FALSE(large);
  CHECK_THAT(large.status().message(), Contains("more than 1024 bytes") && Contains(path));
  const std::string link = (dir / "link").string();
  REQUIRE(::symlink(path.c_str(), link.c_str()) == 0);
  CHECK_FALSE(read_hint(link));
  CHECK_FALSE(write_hint((dir / "missing" / "hint").string(), h));
}

}  // namespace
}  // namespace troupe::comm
