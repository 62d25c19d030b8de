// The strict spelling of troupe's small machine-written texts (base/strict_text.hpp), which the
// snapshot report, the shard coverage, the rendezvous hint and the elastic rendezvous read: every
// count has one text, nothing else is a count; fields keep their empty ones.
#include <catch2/catch.hpp>
#include <cstdint>
#include <limits>
#include <random>
#include <string>

#include "base/strict_text.hpp"

using namespace troupe;

TEST_CASE("strict text: a count has one spelling, within its bound", "[strict_text]") {
  std::mt19937_64 rng(77);
  for (int k = 0; k < 2000; ++k) {
    const int64_t v = static_cast<int64_t>(rng() >> (rng() % 63 + 1));
    int64_t got = -1;
    REQUIRE(parse_strict_count(std::to_string(v), std::numeric_limits<int64_t>::max(), &got));
    CHECK(got == v);
    int64_t untouched = -7;
    if (v > 0) CHECK_FALSE(parse_strict_count(std::to_string(v), v - 1, &untouched));  // above the bound
    CHECK_FALSE(parse_strict_count("0" + std::to_string(v), std::numeric_limits<int64_t>::max(), &untouched));
    CHECK_FALSE(parse_strict_count("+" + std::to_string(v), std::numeric_limits<int64_t>::max(), &untouched));
    CHECK(untouched == -7);
  }
  int64_t v = -1;
  CHECK(parse_strict_count("0", 0, &v));
  CHECK(v == 0);
  for (const char* bad : {"", "-1", " 1", "1 ", "1.0", "0x10", "١", "99999999999999999999", "9223372036854775808"})
    CHECK_FALSE(parse_strict_count(bad, std::numeric_limits<int64_t>::max(), &v));
  CHECK(parse_strict_count("9223372036854775807", std::numeric_limits<int64_t>::max(), &v));
}

TEST_CASE("strict text: fields keep their empty ones; ids are lowercase hex; printable is ASCII", "[strict_text]") {
  CHECK(split_fields("", ' ').size() == 1);
  CHECK(split_fields("a  b", ' ') == std::vector<std::string_view>{"a", "", "b"});
  CHECK(split_fields(" a ", ' ') == std::vector<std::string_view>{"", "a", ""});
  CHECK(split_fields("1,2,3", ',').size() == 3);
  CHECK(is_lower_hex("0123456789abcdef", 16, 16));
  CHECK_FALSE(is_lower_hex("0123456789abcdeF", 1, 64));
  CHECK_FALSE(is_lower_hex("", 1, 64));
  CHECK(is_lower_hex("", 0, 64));
  CHECK_FALSE(is_lower_hex("abc", 4, 64));
  CHECK_FALSE(is_lower_hex("abcde", 1, 4));
  CHECK(is_printable_ascii("refused: node 2 runs --nnodes 1:4"));
  CHECK_FALSE(is_printable_ascii("a\nb"));
  CHECK_FALSE(is_printable_ascii("\x7f"));
  CHECK_FALSE(is_printable_ascii("caf\xc3\xa9"));
}
