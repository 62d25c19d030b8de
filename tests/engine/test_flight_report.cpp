// The inspector's flight and stacks answers (engine/flight_report.hpp, engine/inspect_merge.hpp):
// arguments, a rank's filter, the last N, rank 0's merge of the other processes' parts (bad parts
// listed as unreachable), the stall file's additions.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "engine/flight_report.hpp"
#include "engine/inspect_merge.hpp"

using namespace troupe;
using nlohmann::json;

namespace {

// Two ranks of this process (0 and 1, in a world of 4) with 3 operations each.
Flights two_ranks() {
  Flights out;
  for (int r = 0; r < 2; ++r) {
    auto rec = std::make_shared<comm::FlightRecorder>(r);
    const int g = rec->add_group("world", {0, 1, 2, 3});
    for (int k = 1; k <= 3; ++k) {
      comm::FlightOp op;
      op.seq = static_cast<uint64_t>(k);
      op.kind = comm::FlightKind::all_reduce;
      op.group = g;
      op.bytes = 8;
      rec->finished(rec->issue(op), true);
    }
    out.push_back(rec);
  }
  return out;
}

// What a process holding rank `rank` answers to "local flight ...".
std::string peer_flight(int rank) {
  return json{
      {"ranks",
       json::array({{{"rank", rank}, {"capacity", 256}, {"recorded", 0}, {"ops", json::array()}}})}}
      .dump();
}

}  // namespace

TEST_CASE("flight answers for every rank, one rank, or the last N, and merges the peers",
          "[engine][flight]") {
  const Flights flights = two_ranks();
  int asked = 0;
  AskPeers peers = [&](std::vector<std::string>& unreachable) {
    ++asked;
    unreachable.push_back("10.0.0.9:4000: no answer");
    return std::vector<std::string>{peer_flight(3), peer_flight(2), R"({"error": "boom"})",
                                    "not json"};
  };
  const json all = json::parse(flight_answer(flights, {}, false, peers));
  CHECK(asked == 1);
  REQUIRE(all["ranks"].size() == 4);
  for (int r = 0; r < 4; ++r) CHECK(all["ranks"][static_cast<size_t>(r)]["rank"] == r);  // sorted
  CHECK(all["ranks"][0]["ops"].size() == 3);
  REQUIRE(all["unreachable"].size() == 3);
  CHECK(all["unreachable"][0] == "10.0.0.9:4000: no answer");
  CHECK(all["unreachable"][1].get<std::string>().find("boom") != std::string::npos);

  // A rank of this process: nobody else is asked.
  const json one = json::parse(flight_answer(flights, {"1", "--last", "2"}, false, peers));
  CHECK(asked == 1);
  REQUIRE(one["ranks"].size() == 1);
  CHECK(one["ranks"][0]["rank"] == 1);
  REQUIRE(one["ranks"][0]["ops"].size() == 2);
  CHECK(one["ranks"][0]["ops"][1]["seq"] == 3);  // the newest
  // The local part (what rank 0 asks the others for) never asks.
  const json local = json::parse(flight_answer(flights, {"--last", "1"}, true, peers));
  CHECK(asked == 1);
  CHECK(local["ranks"].size() == 2);
  CHECK(local["ranks"][0]["ops"].size() == 1);
}

TEST_CASE("flight refuses bad arguments and a rank the job does not have", "[engine][flight]") {
  const Flights flights = two_ranks();
  AskPeers none = [](std::vector<std::string>&) { return std::vector<std::string>{}; };
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"x"},
                                             {"--last"},
                                             {"--last", "0"},
                                             {"--last", "-3"},
                                             {"1", "2"},
                                             {"-1"},
                                             {"--last", "5x"}}) {
    const json j = json::parse(flight_answer(flights, args, false, none));
    INFO(j.dump());
    REQUIRE(j.contains("error"));
    CHECK(j["error"].get<std::string>().find("usage: flight [RANK] [--last N]") !=
          std::string::npos);
  }
  const json missing = json::parse(flight_answer(flights, {"9"}, false, none));
  CHECK(missing["error"] == "flight: no rank 9 in this job (its ranks are 0 to 3)");
}

TEST_CASE("merge_answers keeps this process's entries and only well-formed ones of the others",
          "[engine][flight]") {
  const std::string mine = R"({"processes": [{"pid": 30, "threads": []}]})";
  const json j =
      json::parse(merge_answers(mine,
                                {R"({"processes": [{"pid": 7}, {"pid": "8"}, 9]})", R"([1, 2])",
                                 R"({"processes": {"pid": 5}})", R"({"processes": [{"pid": 40}]})"},
                                "processes", "pid", {}));
  REQUIRE(j["processes"].size() == 3);
  CHECK(j["processes"][0]["pid"] == 7);
  CHECK(j["processes"][1]["pid"] == 30);
  CHECK(j["processes"][2]["pid"] == 40);
  CHECK(j["unreachable"].size() == 3);  // 2 bad entries, a non-object, a non-array
  // Nothing wrong: no "unreachable".
  CHECK_FALSE(json::parse(merge_answers(mine, {}, "processes", "pid", {})).contains("unreachable"));
}

TEST_CASE("stacks answers this process's threads; the stall file gains flight and stacks",
          "[engine][flight]") {
  const Flights flights = two_ranks();
  AskPeers none = [](std::vector<std::string>&) { return std::vector<std::string>{}; };
  const json s = json::parse(stacks_answer(flights, {}, false, none));
  REQUIRE(s["processes"].size() == 1);
  const json& p = s["processes"][0];
  CHECK(p["ranks"] == json::array({0, 1}));
  REQUIRE(p["threads"].size() >= 1);
  bool caller = false;
  for (const json& t : p["threads"]) {
    if (!t["caller"].get<bool>()) continue;
    caller = true;
    CHECK(t["answered"] == true);
    CHECK(t["frames"].size() >= 1);
    CHECK(t["frames"][0].contains("module_offset"));
  }
  CHECK(caller);
  CHECK(json::parse(stacks_answer(flights, {"now"}, false, none)).contains("error"));

  const json stall =
      json::parse(with_flight_and_stacks(R"({"summary": "rank 1 ...", "edges": []})", flights));
  CHECK(stall["summary"] == "rank 1 ...");
  CHECK(stall["flight"]["ranks"].size() == 2);
  CHECK(stall["flight"]["ranks"][1]["ops"].size() == 3);
  CHECK(stall["stacks"]["threads"].size() >= 1);
}
