// JSON from outside: parse errors and out-of-range numbers become Status messages naming the key
// path and the range, never exceptions; integers are read without narrowing.
#include <limits>
#include <string>

#include "storage/json_input.hpp"
#include "tests/test_util.hpp"

using Catch::Contains;
using nlohmann::json;
using troupe::json_to_integer;
using troupe::json_to_number;
using troupe::json_to_unsigned;
using troupe::parse_json;

TEST_CASE("json input: a number beyond a double's range names its key path", "[json_input]") {
  auto r = parse_json(R"({"optimizer": {"params": {"lr": 1e400}}})", "ds.json");
  REQUIRE_FALSE(r.is_ok());
  CHECK_THAT(r.status().message(), Contains("ds.json") && Contains("key \"optimizer.params.lr\"") &&
                                       Contains("1e400") && Contains("range of a double"));
  auto in_array = parse_json(R"({"betas": [0.9, -2e999]})", "f");
  REQUIRE_FALSE(in_array.is_ok());
  CHECK_THAT(in_array.status().message(), Contains("key \"betas[1]\"") && Contains("-2e999"));
  auto nested = parse_json(R"([{"a": 1}, {"b": [1, 2, {"c": 1E+400}]}])", "f");
  REQUIRE_FALSE(nested.is_ok());
  CHECK_THAT(nested.status().message(), Contains("key \"[1].b[2].c\""));
  auto top = parse_json("1e400", "f");
  REQUIRE_FALSE(top.is_ok());
  CHECK_THAT(top.status().message(), Contains("the top-level value"));
  // Just inside the range, and integers too large for 64 bits (read as doubles), are fine.
  CHECK(parse_json(R"({"x": 1.7e308, "y": 100000000000000000000000})", "f").is_ok());
}

TEST_CASE("json input: syntax errors, duplicates and deep nesting", "[json_input]") {
  auto bad = parse_json("{\n \"a\": 1,\n \"b\" 2}", "f.json");
  REQUIRE_FALSE(bad.is_ok());
  CHECK_THAT(bad.status().message(),
             Contains("f.json is not valid JSON (byte") && Contains("line 3"));
  CHECK(bad.status().message().find("[json.exception") == std::string::npos);

  troupe::JsonParseOptions dup;
  dup.reject_duplicate_keys = true;
  auto twice = parse_json(R"({"a": {"b": 1, "b": 2}})", "f", dup);
  REQUIRE_FALSE(twice.is_ok());
  CHECK_THAT(twice.status().message(), Contains("key \"a.b\" appears twice"));
  CHECK(parse_json(R"({"a": {"b": 1}, "c": {"b": 2}})", "f", dup).is_ok());  // other objects
  CHECK(parse_json(R"({"a": 1, "a": 2})", "f").is_ok());  // only checked when asked

  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  auto too_deep = parse_json(deep, "f");
  REQUIRE_FALSE(too_deep.is_ok());
  CHECK_THAT(too_deep.status().message(), Contains("nested deeper than 64 levels (at byte 64)"));
  CHECK(parse_json(std::string(64, '[') + std::string(64, ']'), "f").is_ok());
  // Brackets inside strings do not count.
  CHECK(parse_json("[\"" + std::string(1000, '[') + "\\\"[\"]", "f").is_ok());
}

TEST_CASE("json input: integers keep their full width and their range", "[json_input]") {
  int64_t v = 0;
  CHECK(json_to_integer(json::parse("2147483647"), 1, 2147483647, &v).is_ok());
  CHECK(v == 2147483647);
  // 1e19 fits uint64 but not int64; 2^32 + 7 does not fit int32; -1 is not a size.
  auto big = json_to_integer(json::parse("10000000000000000000"), 0, INT64_MAX, &v);
  REQUIRE_FALSE(big.is_ok());
  CHECK_THAT(big.message(),
             Contains("[0, 9223372036854775807]") && Contains("got 10000000000000000000"));
  CHECK_FALSE(json_to_integer(json::parse("4294967303"), 0, 2147483647, &v).is_ok());
  auto negative = json_to_integer(json::parse("-1"), 1, 2147483647, &v);
  REQUIRE_FALSE(negative.is_ok());
  CHECK_THAT(negative.message(), Contains("must be an integer in [1, 2147483647], got -1"));
  CHECK_FALSE(json_to_integer(json::parse("2.5"), 0, 10, &v).is_ok());
  CHECK_FALSE(json_to_integer(json::parse("\"3\""), 0, 10, &v).is_ok());
  CHECK_FALSE(json_to_integer(json::parse("5e8"), 0, INT64_MAX, &v).is_ok());
  CHECK(json_to_integer(json::parse("5e8"), 0, INT64_MAX, &v, /*allow_exponent=*/true).is_ok());
  CHECK(v == 500000000);
  CHECK_FALSE(json_to_integer(json::parse("9.3e18"), 0, INT64_MAX, &v, true).is_ok());
  CHECK(v == 500000000);  // unchanged on failure

  uint64_t u = 0;
  CHECK(json_to_unsigned(json::parse("18446744073709551615"), UINT64_MAX, &u).is_ok());
  CHECK(u == UINT64_MAX);
  CHECK_FALSE(json_to_unsigned(json::parse("-1"), UINT64_MAX, &u).is_ok());

  double d = 0;
  CHECK(json_to_number(json::parse("1e308"), 0, std::numeric_limits<double>::max(), &d).is_ok());
  auto out = json_to_number(json::parse("-0.5"), 0, 1, &d);
  REQUIRE_FALSE(out.is_ok());
  CHECK_THAT(out.message(), Contains("must be a number in [0, 1], got -0.5"));
}
