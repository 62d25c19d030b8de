#include "engine/tensor_stats.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>

#include <nlohmann/json.hpp>

namespace troupe {

TensorStats tensor_stats(const float* values, int64_t n, int bins) {
  TensorStats s;
  s.count = n;
  double lo = std::numeric_limits<double>::infinity(), hi = -lo, sum = 0, sq = 0;
  int64_t finite = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double v = values[i];
    if (std::isnan(v)) {
      ++s.nan;
    } else if (std::isinf(v)) {
      ++s.inf;
    } else {
      ++finite;
      lo = std::min(lo, v);
      hi = std::max(hi, v);
      sum += v;
      sq += v * v;
    }
  }
  if (finite == 0) return s;
  s.min = lo;
  s.max = hi;
  s.mean = sum / static_cast<double>(finite);
  s.norm = std::sqrt(sq);
  double dev = 0;  // a second pass: no cancellation
  for (int64_t i = 0; i < n; ++i) {
    const double v = values[i];
    if (std::isfinite(v)) dev += (v - s.mean) * (v - s.mean);
  }
  s.std = std::sqrt(dev / static_cast<double>(finite));
  if (bins > 0) {
    s.histogram.assign(static_cast<size_t>(bins), 0);
    const double width = (hi - lo) / bins;
    for (int64_t i = 0; i < n; ++i) {
      const double v = values[i];
      if (!std::isfinite(v)) continue;
      int64_t b = width > 0 ? static_cast<int64_t>((v - lo) / width) : 0;
      s.histogram[static_cast<size_t>(std::clamp<int64_t>(b, 0, bins - 1))] += 1;
    }
  }
  return s;
}

Result<AssembledTensor> assemble_pieces(const std::vector<RankPieces>& parts, std::optional<int> only_rank) {
  AssembledTensor out;
  bool first = true;
  int64_t numel = 0;
  for (const RankPieces& part : parts) {
    if (only_rank && part.rank != *only_rank) continue;
    for (const TensorPiece& p : part.pieces) {
      if (first) {
        out.name = p.name;
        out.shape = p.global_shape;
        numel = out.shape.numel();
        out.values.assign(static_cast<size_t>(numel), 0.0f);
        first = false;
      } else if (p.name != out.name || !(p.global_shape == out.shape)) {
        return Status::error("the ranks' pieces disagree: " + out.name + " " + out.shape.str() + " and " + p.name + " " +
                             p.global_shape.str());
      }
      if (out.ranks.empty() || out.ranks.back() != part.rank) out.ranks.push_back(part.rank);
      int64_t at = 0;
      const float* src = p.values.data<float>();
      for (const GlobalRun& run : p.runs) {
        if (run.start < 0 || run.length <= 0 || run.start + run.length > numel || at + run.length > p.values.numel())
          return Status::error("a piece of " + p.name + " lies outside it");
        std::memcpy(out.values.data() + run.start, src + at, static_cast<size_t>(run.length) * sizeof(float));
        at += run.length;
        out.covered += run.length;
      }
    }
  }
  if (first) return Status::error(only_rank ? "rank " + std::to_string(*only_rank) + " holds no part of it" : "no rank holds it");
  std::sort(out.ranks.begin(), out.ranks.end());
  out.ranks.erase(std::unique(out.ranks.begin(), out.ranks.end()), out.ranks.end());
  if (out.covered > numel) return Status::error("the ranks' pieces of " + out.name + " overlap");
  return out;
}

namespace {
constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
}

std::string base64_encode(const void* data, size_t bytes) {
  const auto* in = static_cast<const unsigned char*>(data);
  std::string out;
  out.reserve((bytes + 2) / 3 * 4);
  for (size_t i = 0; i < bytes; i += 3) {
    const uint32_t b0 = in[i], b1 = i + 1 < bytes ? in[i + 1] : 0, b2 = i + 2 < bytes ? in[i + 2] : 0;
    const uint32_t v = (b0 << 16) | (b1 << 8) | b2;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < bytes ? kAlphabet[(v >> 6) & 63] : '=';
    out += i + 2 < bytes ? kAlphabet[v & 63] : '=';
  }
  return out;
}

Result<std::string> base64_decode(const std::string& text) {
  if (text.size() % 4 != 0) return Status::error("base64 of a length that is not a multiple of 4");
  int8_t value[256];
  std::memset(value, -1, sizeof value);
  for (int i = 0; i < 64; ++i) value[static_cast<unsigned char>(kAlphabet[i])] = static_cast<int8_t>(i);
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    const bool last = i + 4 == text.size();
    int pad = 0;
    uint32_t v = 0;
    for (size_t k = 0; k < 4; ++k) {
      const unsigned char c = static_cast<unsigned char>(text[i + k]);
      if (c == '=' && last && k >= 2) {
        ++pad;
        v <<= 6;
        continue;
      }
      if (pad > 0 || value[c] < 0) return Status::error("a character that is not base64");
      v = (v << 6) | static_cast<uint32_t>(value[c]);
    }
    out += static_cast<char>((v >> 16) & 255);
    if (pad < 2) out += static_cast<char>((v >> 8) & 255);
    if (pad < 1) out += static_cast<char>(v & 255);
  }
  return out;
}

std::string pieces_to_json(const std::vector<RankPieces>& parts) {
  nlohmann::json list = nlohmann::json::array();
  for (const RankPieces& part : parts)
    for (const TensorPiece& p : part.pieces) {
      nlohmann::json runs = nlohmann::json::array();
      for (const GlobalRun& r : p.runs) runs.push_back({r.start, r.length});
      list.push_back({{"rank", part.rank},
                      {"name", p.name},
                      {"shape", std::vector<int64_t>(p.global_shape.begin(), p.global_shape.end())},
                      {"runs", runs},
                      {"values", base64_encode(p.values.data<float>(), static_cast<size_t>(p.values.numel()) * 4)}});
    }
  return nlohmann::json{{"pieces", list}}.dump() + "\n";
}

Result<std::vector<RankPieces>> pieces_from_json(const std::string& text) {
  const auto j = nlohmann::json::parse(text, nullptr, false);
  auto bad = [](const std::string& why) { return Status::error("a process's tensor pieces: " + why); };
  if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
  if (j.contains("error") && j["error"].is_string()) return bad(j["error"].get<std::string>());
  if (!j.contains("pieces") || !j["pieces"].is_array()) return bad("no \"pieces\" list");
  std::map<int, RankPieces> by_rank;
  int64_t total = 0;
  for (const auto& p : j["pieces"]) {
    if (!p.is_object() || !p.contains("rank") || !p["rank"].is_number_integer() || !p.contains("name") ||
        !p["name"].is_string() || !p.contains("shape") || !p["shape"].is_array() || !p.contains("runs") ||
        !p["runs"].is_array() || !p.contains("values") || !p["values"].is_string())
      return bad("a piece without rank, name, shape, runs and values");
    const int64_t rank = p["rank"].get<int64_t>();
    if (rank < 0 || rank > (1 << 24)) return bad("a rank out of range");
    std::vector<int64_t> dims;
    int64_t numel = 1;
    if (p["shape"].empty() || p["shape"].size() > static_cast<size_t>(Shape::kMaxRank))
      return bad("a shape of no or more than 6 dimensions");
    for (const auto& d : p["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() <= 0 || d.get<int64_t>() > kMaxPieceElements)
        return bad("a dimension that is not a positive whole number");
      dims.push_back(d.get<int64_t>());
      if (numel > kMaxPieceElements / dims.back()) return bad("a shape of more than 2^30 elements");
      numel *= dims.back();
    }
    const std::string& encoded = p["values"].get_ref<const std::string&>();
    if (encoded.size() / 4 * 3 > static_cast<size_t>(kMaxPieceElements) * 4) return bad("too many values");
    int64_t covered = 0;
    TensorPiece piece;
    for (const auto& r : p["runs"]) {
      if (!r.is_array() || r.size() != 2 || !r[0].is_number_integer() || !r[1].is_number_integer())
        return bad("a run that is not [start, length]");
      const int64_t start = r[0].get<int64_t>(), length = r[1].get<int64_t>();
      if (start < 0 || length <= 0 || start >= numel || length > numel - start) return bad("a run outside the shape");
      covered += length;
      if (covered > numel) return bad("runs longer than the tensor");
      piece.runs.push_back({start, length});
    }
    auto bytes = base64_decode(encoded);
    if (!bytes) return bad(bytes.status().message());
    if (static_cast<int64_t>(bytes.value().size()) != covered * 4) return bad("values of another length than the runs");
    total += covered;
    if (total > kMaxPieceElements) return bad("more than 2^30 elements in all");
    piece.name = p["name"].get<std::string>();
    piece.global_shape = Shape(dims.begin(), dims.end());
    piece.values = Tensor::empty({covered});
    if (covered > 0) std::memcpy(piece.values.data<float>(), bytes.value().data(), bytes.value().size());
    RankPieces& part = by_rank[static_cast<int>(rank)];
    part.rank = static_cast<int>(rank);
    part.pieces.push_back(std::move(piece));
  }
  std::vector<RankPieces> out;
  for (auto& [rank, part] : by_rank) out.push_back(std::move(part));
  return out;
}

}  // namespace troupe
