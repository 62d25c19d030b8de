#include "engine/inspect_merge.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace troupe {

using nlohmann::json;

namespace {
// Names from outside (thread names, symbols, a peer's strings) may not be UTF-8: replaced, not
// thrown.
std::string text(const json& j, int indent = -1) {
  return j.dump(indent, ' ', false, json::error_handler_t::replace);
}
}  // namespace

std::string merge_answers(const std::string& mine, const std::vector<std::string>& answers,
                          const std::string& key, const std::string& order,
                          std::vector<std::string> unreachable) {
  json all = json::parse(mine, nullptr, false);
  if (all.is_discarded() || !all.is_object() || !all.contains(key) || !all[key].is_array())
    all = json{{key, json::array()}};
  for (const std::string& answer : answers) {
    const json j = json::parse(answer, nullptr, false);
    if (j.is_object() && j.contains("error") && j["error"].is_string()) {
      unreachable.push_back("a peer refused: " + j["error"].get<std::string>());
      continue;
    }
    if (j.is_discarded() || !j.is_object() || !j.contains(key) || !j[key].is_array()) {
      unreachable.push_back("a peer's answer is not a {\"" + key + "\": [...]} document");
      continue;
    }
    size_t bad = 0;
    for (const json& entry : j[key]) {
      if (entry.is_object() && entry.contains(order) && entry[order].is_number_integer())
        all[key].push_back(entry);
      else
        ++bad;
    }
    if (bad > 0)
      unreachable.push_back("a peer's answer has " + std::to_string(bad) +
                            " entries without an integer \"" + order + "\"");
  }
  auto& list = all[key];
  std::vector<json> sorted;
  for (json& entry : list)
    if (entry.is_object() && entry.contains(order) && entry[order].is_number_integer())
      sorted.push_back(std::move(entry));
  std::stable_sort(sorted.begin(), sorted.end(), [&](const json& a, const json& b) {
    return a[order].get<int64_t>() < b[order].get<int64_t>();
  });
  list = json(sorted);
  if (!unreachable.empty()) all["unreachable"] = unreachable;
  return text(all, 1) + "\n";
}

}  // namespace troupe
