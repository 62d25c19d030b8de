// What another process's inspector answers to "local flight" and "local stacks"
// (merge_answers, engine/inspect_merge.hpp): read by rank 0's inspector. Properties: the merge is
// a JSON document holding this process's entries and every accepted one, sorted; a bad answer is
// listed as unreachable, never thrown.
#include "engine/inspect_merge.hpp"

#include <nlohmann/json.hpp>

#include "fuzz/fuzz_targets.hpp"
#include "troupe/check.hpp"

namespace troupe::fuzz {

Status inspect_merge(const uint8_t* data, size_t size) {
  const std::string answer(reinterpret_cast<const char*>(data), size);
  const std::string mine = R"({"ranks": [{"rank": 2, "ops": []}, {"rank": 0, "ops": []}]})";
  const std::string merged = merge_answers(mine, {answer, answer}, "ranks", "rank", {});
  const auto j = nlohmann::json::parse(merged, nullptr, false);
  TROUPE_CHECK(j.is_object() && j.contains("ranks") && j["ranks"].is_array(),
               "the merge is not a ranks document");
  const auto& ranks = j["ranks"];
  TROUPE_CHECK(ranks.size() >= 2, "the merge lost this process's ranks");
  for (size_t i = 0; i < ranks.size(); ++i) {
    TROUPE_CHECK(
        ranks[i].is_object() && ranks[i].contains("rank") && ranks[i]["rank"].is_number_integer(),
        "a merged entry has no integer rank");
    if (i > 0)
      TROUPE_CHECK(ranks[i - 1]["rank"].get<int64_t>() <= ranks[i]["rank"].get<int64_t>(),
                   "the merge is not sorted");
  }
  if (j.contains("unreachable")) return Status::error(j["unreachable"].dump());
  return Status::ok();
}

}  // namespace troupe::fuzz
