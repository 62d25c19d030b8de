#include "engine/timeline.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include <sys/stat.h>

#include "storage/durable.hpp"
#include "storage/temp_file.hpp"

namespace troupe {

Status write_chrome_trace(const std::string& path, const comm::Topology& topology,
                          const std::vector<RankTimeline>& timelines) {
  using nlohmann::json;
  json events = json::array();
  for (const RankTimeline& t : timelines) {
    const comm::Coords c = topology.coords(t.rank);
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", 0},
                      {"tid", t.rank},
                      {"args",
                       {{"name", "rank " + std::to_string(t.rank) + " (tp " + std::to_string(c.tp) + ", pp " +
                                     std::to_string(c.pp) + ", dp " + std::to_string(c.dp) + ")"}}}});
    events.push_back({{"name", "thread_sort_index"}, {"ph", "M"}, {"pid", 0}, {"tid", t.rank}, {"args", {{"sort_index", t.rank}}}});
    for (const Span& s : t.spans) {
      events.push_back({{"name", s.name}, {"cat", s.cat}, {"ph", "X"}, {"pid", 0}, {"tid", t.rank},
                        {"ts", s.start_us}, {"dur", s.dur_us}});
    }
  }
  json doc = {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
  // A fresh temporary (never a planted file or symlink), renamed into place; then the mode a file
  // written directly would have.
  TROUPE_RETURN_IF_ERROR(write_text_atomically(path, doc.dump()).with_context("writing the timeline: "));
  (void)::chmod(path.c_str(), default_file_mode());
  return Status::ok();
}

std::string timelines_to_json(const std::vector<RankTimeline>& timelines) {
  using nlohmann::json;
  json out = json::array();
  for (const RankTimeline& t : timelines) {
    json spans = json::array();
    for (const Span& s : t.spans) spans.push_back({s.name, s.cat, s.start_us, s.dur_us});
    out.push_back({{"rank", t.rank}, {"stage", t.stage}, {"spans", std::move(spans)}});
  }
  return out.dump();
}

Result<std::vector<RankTimeline>> timelines_from_json(const std::string& text) {
  using nlohmann::json;
  std::vector<RankTimeline> out;
  try {
    for (const json& j : json::parse(text)) {
      RankTimeline t;
      t.rank = j.at("rank").get<int>();
      t.stage = j.at("stage").get<int>();
      for (const json& s : j.at("spans"))
        t.spans.push_back({s.at(0).get<std::string>(), s.at(1).get<std::string>(), s.at(2).get<double>(),
                           s.at(3).get<double>()});
      out.push_back(std::move(t));
    }
  } catch (const json::exception& e) {
    return Status::error(std::string("a rank sent a malformed timeline: ") + e.what());
  }
  return out;
}

std::vector<BusyShare> busy_shares(const std::vector<RankTimeline>& timelines) {
  std::vector<BusyShare> out;
  for (const RankTimeline& t : timelines) {
    BusyShare b;
    b.rank = t.rank;
    double first = 1e300, last = -1e300, busy = 0;
    for (const Span& s : t.spans) {
      first = std::min(first, s.start_us);
      last = std::max(last, s.start_us + s.dur_us);
      if (s.cat == "forward" || s.cat == "backward" || s.cat == "weight") busy += s.dur_us;
    }
    b.span_us = last > first ? last - first : 0;
    b.busy = b.span_us > 0 ? busy / b.span_us : 0;
    out.push_back(b);
  }
  return out;
}

}  // namespace troupe
