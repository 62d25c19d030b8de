#include "comm/topology.hpp"

#include <algorithm>
#include <cstdint>

namespace troupe::comm {

namespace {

constexpr std::array<Dim, kNumDims> kAllDims = {Dim::tp, Dim::cp, Dim::ep, Dim::dp, Dim::pp};

unsigned bit(Dim d) {
  return 1u << static_cast<unsigned>(d);
}

std::string sizes_text(const ParallelSizes& s) {
  return "tp=" + std::to_string(s.tp) + " cp=" + std::to_string(s.cp) +
         " ep=" + std::to_string(s.ep) + " dp=" + std::to_string(s.dp) +
         " pp=" + std::to_string(s.pp);
}

bool parse_dim(std::string_view name, Dim* out) {
  for (Dim d : kAllDims) {
    if (name == dim_name(d)) {
      *out = d;
      return true;
    }
  }
  return false;
}

}  // namespace

const char* dim_name(Dim dim) {
  switch (dim) {
    case Dim::tp:
      return "tp";
    case Dim::cp:
      return "cp";
    case Dim::ep:
      return "ep";
    case Dim::dp:
      return "dp";
    case Dim::pp:
      return "pp";
  }
  return "?";
}

const char* group_kind_name(GroupKind kind) {
  switch (kind) {
    case GroupKind::tp:
      return "tp";
    case GroupKind::cp:
      return "cp";
    case GroupKind::ep:
      return "ep";
    case GroupKind::dp:
      return "dp";
    case GroupKind::pp:
      return "pp";
    case GroupKind::mp:
      return "mp";
    case GroupKind::embedding:
      return "embedding";
    case GroupKind::dp_cp:
      return "dp_cp";
  }
  return "?";
}

int ParallelSizes::of(Dim dim) const {
  switch (dim) {
    case Dim::tp:
      return tp;
    case Dim::cp:
      return cp;
    case Dim::ep:
      return ep;
    case Dim::dp:
      return dp;
    case Dim::pp:
      return pp;
  }
  return 0;
}

int Coords::of(Dim dim) const {
  switch (dim) {
    case Dim::tp:
      return tp;
    case Dim::cp:
      return cp;
    case Dim::ep:
      return ep;
    case Dim::dp:
      return dp;
    case Dim::pp:
      return pp;
  }
  return 0;
}

int& Coords::of(Dim dim) {
  switch (dim) {
    case Dim::tp:
      return tp;
    case Dim::cp:
      return cp;
    case Dim::ep:
      return ep;
    case Dim::dp:
      return dp;
    case Dim::pp:
      break;
  }
  return pp;
}

Result<Topology> Topology::create(ParallelSizes sizes, int world_size, std::string_view order) {
  for (Dim d : kAllDims) {
    if (sizes.of(d) < 1) {
      return Status::error("invalid parallel sizes (" + sizes_text(sizes) + "): " + dim_name(d) +
                           " is " + std::to_string(sizes.of(d)) +
                           "; every size must be at least 1");
    }
  }
  int64_t product = 1;
  for (Dim d : kAllDims) {
    product *= sizes.of(d);
    if (product > (int64_t{1} << 31)) break;  // larger than any int world size; refused below
  }
  if (world_size < 1 || product != world_size) {
    return Status::error("world size " + std::to_string(world_size) +
                         " does not match the parallel sizes (" + sizes_text(sizes) + ", product " +
                         std::to_string(product) +
                         "); choose sizes whose product tp*cp*ep*dp*pp equals the number of ranks");
  }

  // Parse the order: fields separated by '-', fastest first.
  std::string quoted(1, '\'');
  quoted.append(order).push_back('\'');
  std::array<Dim, kNumDims> dims{};
  int n = 0;
  unsigned seen = 0;
  size_t start = 0;
  while (true) {
    size_t dash = order.find('-', start);
    std::string_view field =
        order.substr(start, dash == std::string_view::npos ? std::string_view::npos : dash - start);
    Dim d;
    if (field.empty()) {
      return Status::error("parallel order " + quoted +
                           " has an empty field; write dimension names separated by '-', e.g. "
                           "'tp-cp-ep-dp-pp'");
    }
    if (!parse_dim(field, &d)) {
      return Status::error("parallel order " + quoted + " names an unknown dimension '" +
                           std::string(field) +
                           "'; known are tp, cp, ep, dp, pp (e.g. 'tp-cp-ep-dp-pp')");
    }
    if (seen & bit(d)) {
      return Status::error("parallel order " + quoted + " names '" + std::string(field) +
                           "' twice; name each dimension at most once");
    }
    seen |= bit(d);
    dims[n++] = d;
    if (dash == std::string_view::npos) break;
    start = dash + 1;
  }
  for (Dim d : kAllDims) {
    if (seen & bit(d)) continue;
    if (sizes.of(d) > 1) {
      return Status::error("parallel order " + quoted + " leaves out " + dim_name(d) +
                           ", whose size is " + std::to_string(sizes.of(d)) +
                           "; add it (e.g. 'tp-cp-ep-dp-pp')");
    }
    dims[n++] = d;  // size 1: its place does not matter
  }

  Topology t;
  t.sizes_ = sizes;
  t.world_size_ = world_size;
  t.order_ = std::string(order);
  int stride = 1;
  for (Dim d : dims) {
    t.stride_[static_cast<int>(d)] = stride;
    stride *= sizes.of(d);
  }
  return t;
}

Coords Topology::coords(int rank) const {
  TROUPE_CHECK(rank >= 0 && rank < world_size_,
               "rank out of range for this topology; pass 0 <= rank < world size");
  Coords c;
  for (Dim d : kAllDims) c.of(d) = (rank / stride(d)) % sizes_.of(d);
  return c;
}

int Topology::rank(const Coords& c) const {
  int r = 0;
  for (Dim d : kAllDims) {
    TROUPE_CHECK(c.of(d) >= 0 && c.of(d) < sizes_.of(d),
                 "coordinate out of range for this topology");
    r += c.of(d) * stride(d);
  }
  return r;
}

std::vector<int> Topology::vary(int rank, unsigned mask) const {
  Coords c = coords(rank);
  int base = rank;
  std::vector<Dim> varied;  // in order of increasing stride, so the odometer below counts upwards
  for (Dim d : kAllDims) {
    if (!(mask & bit(d))) continue;
    base -= c.of(d) * stride(d);
    varied.push_back(d);
  }
  std::sort(varied.begin(), varied.end(), [&](Dim a, Dim b) { return stride(a) < stride(b); });
  int count = 1;
  for (Dim d : varied) count *= sizes_.of(d);
  std::vector<int> members;
  members.reserve(count);
  std::vector<int> digit(varied.size(), 0);
  for (int i = 0; i < count; ++i) {
    int r = base;
    for (size_t k = 0; k < varied.size(); ++k) r += digit[k] * stride(varied[k]);
    members.push_back(r);
    for (size_t k = 0; k < varied.size(); ++k) {  // increment, fastest digit first
      if (++digit[k] < sizes_.of(varied[k])) break;
      digit[k] = 0;
    }
  }
  return members;
}

std::vector<int> Topology::group(GroupKind kind, int rank) const {
  switch (kind) {
    case GroupKind::tp:
      return vary(rank, bit(Dim::tp));
    case GroupKind::cp:
      return vary(rank, bit(Dim::cp));
    case GroupKind::ep:
      return vary(rank, bit(Dim::ep));
    case GroupKind::dp:
      return vary(rank, bit(Dim::dp));
    case GroupKind::pp:
      return vary(rank, bit(Dim::pp));
    case GroupKind::mp:
      return vary(rank, bit(Dim::tp) | bit(Dim::pp));
    case GroupKind::dp_cp:
      return vary(rank, bit(Dim::dp) | bit(Dim::cp));
    case GroupKind::embedding: {
      std::vector<int> pp = vary(rank, bit(Dim::pp));
      if (pp.size() == 1) return pp;
      if (rank != pp.front() && rank != pp.back()) return {};
      return {pp.front(), pp.back()};
    }
  }
  return {};
}

std::vector<std::vector<int>> Topology::all_groups(GroupKind kind) const {
  // A group's lowest member is the one whose varied coordinates are all zero.
  const GroupKind base_kind = kind == GroupKind::embedding ? GroupKind::pp : kind;
  std::vector<std::vector<int>> groups;
  for (int r = 0; r < world_size_; ++r) {
    std::vector<int> g = group(base_kind, r);
    if (g.front() != r) continue;
    groups.push_back(kind == GroupKind::embedding ? group(kind, r) : std::move(g));
  }
  return groups;
}

std::string Topology::describe() const {
  return sizes_text(sizes_) + " (world " + std::to_string(world_size_) + ", order " + order_ + ")";
}

std::vector<int> Topology::expert_parallel_group(int rank, int ep) const {
  const std::vector<int> dp = dp_group(rank);
  TROUPE_CHECK(ep >= 1 && dp.size() % static_cast<size_t>(ep) == 0, "Topology: ep must divide the dp size");
  const int d = coords(rank).dp;
  return std::vector<int>(dp.begin() + (d / ep) * ep, dp.begin() + (d / ep) * ep + ep);
}

std::vector<int> Topology::expert_data_parallel_group(int rank, int ep) const {
  TROUPE_CHECK(ep >= 1 && dp_group(rank).size() % static_cast<size_t>(ep) == 0, "Topology: ep must divide the dp size");
  const int d = coords(rank).dp;
  // The dp x cp ranks holding the same experts: every cp rank's tokens reach them too.
  std::vector<int> out;
  for (const int other : dp_cp_group(rank))
    if (coords(other).dp % ep == d % ep) out.push_back(other);
  return out;
}

}  // namespace troupe::comm
