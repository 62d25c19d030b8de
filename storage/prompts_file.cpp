// storage/prompts_file.hpp.
#include "storage/prompts_file.hpp"

#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace troupe {

Result<std::vector<std::string>> parse_prompts_jsonl(std::string_view text, const std::string& name) {
  std::vector<std::string> out, problems;
  size_t bad = 0;
  int64_t number = 0;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find('\n', at);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(at, end - at);
    at = end + 1;
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_string()) {
      out.push_back(j.get<std::string>());
    } else if (j.is_object() && j.contains("prompt") && j["prompt"].is_string()) {
      out.push_back(j["prompt"].get<std::string>());
    } else if (++bad <= 10) {
      problems.push_back(fmt::format("{} line {}: not a JSON string or an object with a \"prompt\" string", name, number));
    }
  }
  if (bad == 0) return out;
  std::string message = problems.size() == 1 ? problems[0] : fmt::format("{} lines are not prompts:", bad);
  if (problems.size() > 1)
    for (const std::string& p : problems) message += "\n  - " + p;
  return Status::bad_input(message + "\n  -- write one prompt per line, e.g. {\"prompt\": \"Once upon a time\"}");
}

Result<std::vector<std::string>> read_prompts_file(const std::string& path) {
  const std::string name = "--prompts-file " + path;
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return Status::bad_input(name + " cannot be read -- check the path");
  const std::streamoff size = in.tellg();
  if (size < 0 || size > (std::streamoff{1} << 30))
    return Status::bad_input(name + " is over 1 GiB -- split the prompts over several runs");
  std::string text(static_cast<size_t>(size), '\0');
  in.seekg(0);
  if (!in.read(text.data(), size)) return Status::bad_input(name + " cannot be read -- check the file");
  return parse_prompts_jsonl(text, name);
}

}  // namespace troupe
