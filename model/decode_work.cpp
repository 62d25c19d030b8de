#include "model/decode_work.hpp"

#include <algorithm>
#include <cstring>

namespace troupe {

namespace {

constexpr char kMagic[4] = {'T', 'D', 'W', '1'};

void put_bytes(std::string& out, const void* p, size_t n) { out.append(static_cast<const char*>(p), n); }
template <class T>
void put(std::string& out, T v) {
  put_bytes(out, &v, sizeof v);
}

// Reads fixed-size values off the front of the bytes; every read checks what is left.
class Reader {
 public:
  explicit Reader(std::string_view b) : b_(b) {}
  template <class T>
  bool get(T& v) {
    if (b_.size() < sizeof v) return false;
    std::memcpy(&v, b_.data(), sizeof v);
    b_.remove_prefix(sizeof v);
    return true;
  }
  size_t left() const { return b_.size(); }

 private:
  std::string_view b_;
};

Status bad(const std::string& what) {
  return Status::bad_input("a decode feed from rank 0: " + what +
                           " -- the ranks of a decoder must run the same troupe build in one job");
}

}  // namespace

std::vector<size_t> split_micro_batches(const std::vector<int64_t>& row0, int micro_batches) {
  std::vector<size_t> group_end;
  const size_t S = row0.empty() ? 0 : row0.size() - 1;
  if (S == 0) return group_end;
  const size_t m = std::min(S, static_cast<size_t>(std::max(1, micro_batches)));
  const int64_t R = row0.back();
  size_t end = 0;
  for (size_t k = 1; k < m; ++k) {
    const int64_t target = R * static_cast<int64_t>(k) / static_cast<int64_t>(m);
    ++end;
    while (end < S && row0[end] < target) ++end;
    end = std::min(end, S - (m - k));  // room for the groups after
    group_end.push_back(end);
  }
  group_end.push_back(S);
  return group_end;
}

std::string encode_decode_work(const DecodeWork& w) {
  std::string out;
  put_bytes(out, kMagic, sizeof kMagic);
  put(out, static_cast<uint32_t>(w.ops.size()));
  for (const SlotOp& op : w.ops) {
    put(out, static_cast<uint8_t>(op.kind));
    put(out, static_cast<int32_t>(op.id));
    put(out, static_cast<int32_t>(op.from));
  }
  put(out, static_cast<uint32_t>(w.rows.ids.size()));
  for (size_t i = 0; i < w.rows.ids.size(); ++i) {
    put(out, static_cast<int32_t>(w.rows.ids[i]));
    put(out, static_cast<uint8_t>(w.every[i] != 0));
    put(out, static_cast<uint32_t>(w.tokens[i].size()));
    put_bytes(out, w.tokens[i].data(), w.tokens[i].size() * sizeof(int32_t));
  }
  put(out, static_cast<uint32_t>(w.group_end.size()));
  for (size_t e : w.group_end) put(out, static_cast<uint32_t>(e));
  return out;
}

Result<DecodeWork> parse_decode_work(std::string_view bytes, int64_t vocab_size) {
  if (bytes.size() < sizeof kMagic || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0)
    return bad("it does not start with TDW1");
  Reader r(bytes.substr(sizeof kMagic));
  DecodeWork w;
  uint32_t n = 0;
  if (!r.get(n)) return bad("cut short before its sequence changes");
  if (n > r.left() / 9) return bad(std::to_string(n) + " sequence changes in " + std::to_string(r.left()) + " bytes");
  w.ops.resize(n);
  for (SlotOp& op : w.ops) {
    uint8_t kind = 0;
    int32_t id = 0, from = 0;
    r.get(kind), r.get(id), r.get(from);
    if (kind > SlotOp::copy) return bad("a sequence change of kind " + std::to_string(kind));
    if (id < 0 || from < 0) return bad("a negative sequence id");
    op = {static_cast<SlotOp::Kind>(kind), id, from};
  }
  if (!r.get(n)) return bad("cut short before its sequences");
  if (n > r.left() / 9) return bad(std::to_string(n) + " sequences in " + std::to_string(r.left()) + " bytes");
  w.rows.ids.resize(n);
  w.every.resize(n);
  w.tokens.resize(n);
  w.rows.row0.assign(1, 0);
  for (uint32_t i = 0; i < n; ++i) {
    int32_t id = 0;
    uint8_t every = 0;
    uint32_t count = 0;
    if (!r.get(id) || !r.get(every) || !r.get(count)) return bad("cut short in sequence " + std::to_string(i));
    if (id < 0) return bad("a negative sequence id");
    if (every > 1) return bad("an every-row flag of " + std::to_string(every));
    if (count == 0) return bad("sequence " + std::to_string(i) + " has no tokens");
    if (count > r.left() / sizeof(int32_t)) return bad(std::to_string(count) + " tokens in " + std::to_string(r.left()) + " bytes");
    std::vector<int32_t>& t = w.tokens[i];
    t.resize(count);
    for (int32_t& tok : t) {
      r.get(tok);
      if (tok < 0 || tok >= vocab_size) return bad("token " + std::to_string(tok) + " outside the vocabulary");
    }
    w.rows.ids[i] = id;
    w.every[i] = every;
    w.rows.row0.push_back(w.rows.row0.back() + count);
  }
  if (!r.get(n)) return bad("cut short before its micro-batches");
  if (n > r.left() / 4) return bad(std::to_string(n) + " micro-batches in " + std::to_string(r.left()) + " bytes");
  size_t last = 0;
  for (uint32_t k = 0; k < n; ++k) {
    uint32_t e = 0;
    r.get(e);
    if (e <= last || e > w.rows.ids.size()) return bad("micro-batch " + std::to_string(k) + " ends at sequence " + std::to_string(e));
    w.group_end.push_back(e);
    last = e;
  }
  if (last != w.rows.ids.size()) return bad("its micro-batches do not end at its last sequence");
  if (r.left() != 0) return bad(std::to_string(r.left()) + " bytes after the end");
  if (w.rows.ids.empty()) w.rows.row0.clear();
  return w;
}

size_t decode_logits_count(const DecodeWork& w, int64_t vocab_size) {
  size_t rows = 0;
  for (size_t i = 0; i < w.tokens.size(); ++i) rows += w.every[i] ? w.tokens[i].size() : 1;
  return rows * static_cast<size_t>(vocab_size);
}

}  // namespace troupe
