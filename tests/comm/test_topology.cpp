// Topology: the worked examples of comm/topology.hpp, round trips and group partitions over several
// orders and sizes, and refusal of invalid sizes and orders.
#include <algorithm>
#include <catch2/catch.hpp>
#include <set>

#include "comm/topology.hpp"

using namespace troupe;
using namespace troupe::comm;

namespace {

using Groups = std::vector<std::vector<int>>;

Topology make(ParallelSizes s, int world, std::string_view order = Topology::kDefaultOrder) {
  auto t = Topology::create(s, world, order);
  INFO(t.status().message());
  REQUIRE(t.is_ok());
  return t.value();
}

constexpr GroupKind kPartitionKinds[] = {GroupKind::tp, GroupKind::cp, GroupKind::ep,
                                         GroupKind::dp, GroupKind::pp, GroupKind::mp, GroupKind::dp_cp};

// The dimensions a group kind varies.
std::vector<Dim> varied(GroupKind k) {
  switch (k) {
    case GroupKind::tp:
      return {Dim::tp};
    case GroupKind::cp:
      return {Dim::cp};
    case GroupKind::ep:
      return {Dim::ep};
    case GroupKind::dp:
      return {Dim::dp};
    case GroupKind::pp:
      return {Dim::pp};
    case GroupKind::mp:
      return {Dim::tp, Dim::pp};
    case GroupKind::embedding:
      return {Dim::pp};
    case GroupKind::dp_cp:
      return {Dim::dp, Dim::cp};
  }
  return {};
}

void check_consistent(const Topology& t) {
  INFO(t.describe());
  const int world = t.world_size();
  // Round trips, and coordinates within range.
  std::set<std::vector<int>> seen_coords;
  for (int r = 0; r < world; ++r) {
    Coords c = t.coords(r);
    REQUIRE(t.rank(c) == r);
    seen_coords.insert({c.tp, c.cp, c.ep, c.dp, c.pp});
  }
  REQUIRE(static_cast<int>(seen_coords.size()) == world);

  for (GroupKind kind : kPartitionKinds) {
    INFO("kind " << group_kind_name(kind));
    const Groups all = t.all_groups(kind);
    std::vector<int> owner(world, -1);
    int expected_size = 1;
    for (Dim d : varied(kind)) expected_size *= t.sizes().of(d);
    for (size_t g = 0; g < all.size(); ++g) {
      REQUIRE(static_cast<int>(all[g].size()) == expected_size);
      REQUIRE(std::is_sorted(all[g].begin(), all[g].end()));
      if (g > 0) REQUIRE(all[g - 1].front() < all[g].front());
      for (int m : all[g]) {
        REQUIRE(owner[m] == -1);  // in exactly one group of this kind
        owner[m] = static_cast<int>(g);
      }
    }
    REQUIRE(std::count(owner.begin(), owner.end(), -1) == 0);
    for (int r = 0; r < world; ++r) {
      const std::vector<int> g = t.group(kind, r);
      REQUIRE(g == all[owner[r]]);
      // Members share every coordinate the kind does not vary.
      const Coords c = t.coords(r);
      for (int m : g) {
        const Coords cm = t.coords(m);
        for (Dim d : {Dim::tp, Dim::cp, Dim::ep, Dim::dp, Dim::pp}) {
          const auto v = varied(kind);
          if (std::find(v.begin(), v.end(), d) == v.end()) REQUIRE(cm.of(d) == c.of(d));
        }
      }
      // Single-dimension groups: group rank == the coordinate.
      if (varied(kind).size() == 1) {
        const auto pos = std::find(g.begin(), g.end(), r) - g.begin();
        REQUIRE(pos == c.of(varied(kind)[0]));
      }
    }
  }

  // Embedding: first and last stage of each pp group; middle stages have none.
  const Groups emb = t.all_groups(GroupKind::embedding);
  REQUIRE(static_cast<int>(emb.size()) == world / t.sizes().pp);
  for (int r = 0; r < world; ++r) {
    const std::vector<int> pp = t.pp_group(r);
    const std::vector<int> e = t.embedding_group(r);
    if (t.sizes().pp == 1) {
      REQUIRE(e == std::vector<int>{r});
    } else if (r == pp.front() || r == pp.back()) {
      REQUIRE(e == std::vector<int>{pp.front(), pp.back()});
      REQUIRE(std::find(emb.begin(), emb.end(), e) != emb.end());
    } else {
      REQUIRE(e.empty());
    }
    REQUIRE(t.is_first_stage(r) == (r == pp.front()));
    REQUIRE(t.is_last_stage(r) == (r == pp.back()));
  }
}

}  // namespace

TEST_CASE("worked example 1: tp=2 pp=2 dp=2, default order", "[comm][topology]") {
  Topology t = make({.tp = 2, .pp = 2, .dp = 2}, 8);
  REQUIRE(t.stride(Dim::tp) == 1);
  REQUIRE(t.stride(Dim::dp) == 2);
  REQUIRE(t.stride(Dim::pp) == 4);
  const Coords c = t.coords(5);
  REQUIRE(c == Coords{.tp = 1, .pp = 1, .dp = 0});
  REQUIRE(t.rank(Coords{.tp = 1, .pp = 1, .dp = 0}) == 5);
  REQUIRE(t.tp_group(5) == std::vector<int>{4, 5});
  REQUIRE(t.dp_group(5) == std::vector<int>{5, 7});
  REQUIRE(t.pp_group(5) == std::vector<int>{1, 5});
  REQUIRE(t.embedding_group(5) == std::vector<int>{1, 5});
  REQUIRE(t.cp_group(5) == std::vector<int>{5});
  REQUIRE(t.all_groups(GroupKind::tp) == Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}});
  REQUIRE(t.all_groups(GroupKind::dp) == Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}});
  REQUIRE(t.all_groups(GroupKind::pp) == Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
  REQUIRE(t.all_groups(GroupKind::mp) == Groups{{0, 1, 4, 5}, {2, 3, 6, 7}});
  check_consistent(t);
}

TEST_CASE("worked example 2: tp=2 dp=3", "[comm][topology]") {
  Topology t = make({.tp = 2, .dp = 3}, 6);
  REQUIRE(t.coords(3) == Coords{.tp = 1, .dp = 1});
  REQUIRE(t.all_groups(GroupKind::tp) == Groups{{0, 1}, {2, 3}, {4, 5}});
  REQUIRE(t.all_groups(GroupKind::dp) == Groups{{0, 2, 4}, {1, 3, 5}});
  REQUIRE(t.pp_group(3) == std::vector<int>{3});
  REQUIRE(t.embedding_group(3) == std::vector<int>{3});
  check_consistent(t);
}

TEST_CASE("worked example 3: tp=1 pp=4 dp=2, embedding groups", "[comm][topology]") {
  Topology t = make({.pp = 4, .dp = 2}, 8);
  REQUIRE(t.coords(2) == Coords{.pp = 1, .dp = 0});
  REQUIRE(t.all_groups(GroupKind::pp) == Groups{{0, 2, 4, 6}, {1, 3, 5, 7}});
  REQUIRE(t.all_groups(GroupKind::embedding) == Groups{{0, 6}, {1, 7}});
  REQUIRE(t.embedding_group(2).empty());
  REQUIRE(t.embedding_group(6) == std::vector<int>{0, 6});
  check_consistent(t);
}

TEST_CASE("worked example 4: order tp-pp-dp", "[comm][topology]") {
  Topology t = make({.tp = 2, .pp = 2, .dp = 2}, 8, "tp-pp-dp");
  REQUIRE(t.coords(5) == Coords{.tp = 1, .pp = 0, .dp = 1});
  REQUIRE(t.dp_group(5) == std::vector<int>{1, 5});
  REQUIRE(t.pp_group(5) == std::vector<int>{5, 7});
  check_consistent(t);
}

TEST_CASE("worked example 5: tp=2 cp=2 dp=2", "[comm][topology]") {
  Topology t = make({.tp = 2, .dp = 2, .cp = 2}, 8);
  REQUIRE(t.coords(6) == Coords{.tp = 0, .dp = 1, .cp = 1});
  REQUIRE(t.cp_group(6) == std::vector<int>{4, 6});
  REQUIRE(t.dp_group(6) == std::vector<int>{2, 6});
  REQUIRE(t.tp_group(6) == std::vector<int>{6, 7});
  check_consistent(t);
}

TEST_CASE("Megatron's documented layout: 16 ranks, tp=2 pp=4 dp=2", "[comm][topology]") {
  // From megatron/core/parallel_state.py initialize_model_parallel's docstring.
  Topology t = make({.tp = 2, .pp = 4, .dp = 2}, 16);
  REQUIRE(t.all_groups(GroupKind::tp) ==
          Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}});
  REQUIRE(t.all_groups(GroupKind::dp) ==
          Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}});
  REQUIRE(t.all_groups(GroupKind::pp) ==
          Groups{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}});
  REQUIRE(t.all_groups(GroupKind::embedding) == Groups{{0, 12}, {1, 13}, {2, 14}, {3, 15}});
  check_consistent(t);
}

TEST_CASE("round trips and partitions over sizes and orders", "[comm][topology]") {
  struct Case {
    ParallelSizes sizes;
    const char* order;
  };
  const Case cases[] = {
      {{.tp = 1}, "tp-cp-ep-dp-pp"},
      {{.tp = 2, .pp = 2, .dp = 2}, "tp-cp-ep-dp-pp"},
      {{.tp = 2, .pp = 2, .dp = 2}, "tp-dp-pp"},
      {{.tp = 2, .pp = 2, .dp = 2}, "pp-dp-tp"},
      {{.tp = 4, .pp = 2, .dp = 1}, "tp-cp-ep-dp-pp"},
      {{.tp = 1, .pp = 4, .dp = 2}, "tp-cp-ep-dp-pp"},
      {{.tp = 1, .pp = 4, .dp = 2}, "dp-pp"},
      {{.tp = 2, .pp = 1, .dp = 3}, "tp-dp"},
      {{.tp = 3, .pp = 5, .dp = 2}, "dp-tp-pp"},
      {{.tp = 2, .pp = 3, .dp = 2, .cp = 2}, "tp-cp-ep-dp-pp"},
      {{.tp = 2, .pp = 2, .dp = 2, .cp = 1, .ep = 2}, "tp-cp-ep-dp-pp"},
      {{.tp = 2, .pp = 2, .dp = 3, .cp = 2, .ep = 2}, "ep-pp-tp-dp-cp"},
      {{.tp = 1, .pp = 7, .dp = 1}, "pp"},
  };
  for (const Case& c : cases) {
    const ParallelSizes& s = c.sizes;
    check_consistent(make(s, s.tp * s.pp * s.dp * s.cp * s.ep, c.order));
  }
}

TEST_CASE("the order string sets the strides", "[comm][topology]") {
  Topology t = make({.tp = 2, .pp = 3, .dp = 5}, 30, "pp-tp-dp");
  REQUIRE(t.stride(Dim::pp) == 1);
  REQUIRE(t.stride(Dim::tp) == 3);
  REQUIRE(t.stride(Dim::dp) == 6);
  // rank = pp + 3*tp + 6*dp: rank 23 = 2 + 3*1 + 6*3.
  REQUIRE(t.coords(23) == Coords{.tp = 1, .pp = 2, .dp = 3});
  REQUIRE(t.pp_group(23) == std::vector<int>{21, 22, 23});
  REQUIRE(t.embedding_group(23) == std::vector<int>{21, 23});
  REQUIRE(t.describe() == "tp=2 cp=1 ep=1 dp=5 pp=3 (world 30, order pp-tp-dp)");
}

TEST_CASE("invalid sizes and orders are refused with messages naming them", "[comm][topology]") {
  auto refused = [](ParallelSizes s, int world, std::string_view order,
                    std::vector<std::string> words) {
    auto t = Topology::create(s, world, order);
    REQUIRE_FALSE(t.is_ok());
    for (const std::string& w : words) {
      INFO(t.status().message() << "  should mention: " << w);
      CHECK(t.status().message().find(w) != std::string::npos);
    }
  };
  refused({.tp = 0}, 1, "tp-dp-pp", {"tp is 0", "at least 1"});
  refused({.tp = 2, .pp = -1}, 2, "tp-dp-pp", {"pp is -1"});
  refused({.tp = 2, .ep = 0}, 2, "tp-dp-pp", {"ep is 0"});
  refused({.tp = 2, .pp = 2, .dp = 2}, 6, "tp-dp-pp", {"world size 6", "product 8"});
  refused({.tp = 2, .dp = 3}, 0, "tp-dp-pp", {"world size 0"});
  refused({.tp = 2, .dp = 3, .cp = 2}, 6, "tp-cp-dp", {"world size 6", "cp=2", "product 12"});
  refused({.tp = 2}, 2, "tp-xp-pp", {"'tp-xp-pp'", "unknown dimension 'xp'"});
  refused({.tp = 2}, 2, "tp-dp-tp", {"'tp-dp-tp'", "'tp' twice"});
  refused({.tp = 2, .dp = 2}, 4, "tp-pp", {"'tp-pp'", "leaves out dp", "size is 2"});
  refused({.tp = 2}, 2, "tp--pp", {"'tp--pp'", "empty field"});
  refused({.tp = 1}, 1, "", {"''", "empty field"});
  refused({.tp = 2}, 2, "TP-dp", {"unknown dimension 'TP'"});
  // Dimensions of size 1 may be left out.
  REQUIRE(Topology::create({.tp = 2, .dp = 2}, 4, "dp-tp").is_ok());
  REQUIRE(Topology::create({.tp = 1}, 1, "pp").is_ok());
}
