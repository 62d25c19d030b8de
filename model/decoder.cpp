// model/decoder.hpp.
#include "model/decoder.hpp"

namespace troupe {

int SequenceBook::open() {
  size_t id = 0;
  while (id < length_.size() && length_[id] >= 0) ++id;
  if (id == length_.size()) length_.push_back(0);
  length_[id] = 0;
  return static_cast<int>(id);
}

bool SequenceBook::is_open(int id) const {
  return id >= 0 && static_cast<size_t>(id) < length_.size() && length_[static_cast<size_t>(id)] >= 0;
}

void SequenceBook::close(int id) {
  TROUPE_CHECK(is_open(id), "decoder: no sequence " + std::to_string(id));
  length_[static_cast<size_t>(id)] = -1;
}

int64_t SequenceBook::length(int id) const {
  TROUPE_CHECK(is_open(id), "decoder: no sequence " + std::to_string(id));
  return length_[static_cast<size_t>(id)];
}

void SequenceBook::grow(int id, int64_t tokens) {
  TROUPE_CHECK(is_open(id), "decoder: no sequence " + std::to_string(id));
  length_[static_cast<size_t>(id)] += tokens;
}

std::string Decoder::check(const GptConfig& config) { return check_decoder_layout(config, 1, 1); }

namespace {
DecoderShardSpec whole_in(const GptConfig& config, DType dtype) {
  DecoderShardSpec s = DecoderShardSpec::whole(config);
  s.dtype = dtype;
  return s;
}
}  // namespace

Decoder::Decoder(const GptConfig& config, DType dtype) : shard_(config, whole_in(config, dtype)) {}

void Decoder::load_from(const Decoder& whole) {
  TROUPE_CHECK(whole.dtype() == DType::f32, "Decoder::load_from: the whole model must be f32");
  shard_.load_from_whole([&whole](const std::string& name) { return whole.param(name); });
}

Tensor Decoder::param(const std::string& name) const {
  for (size_t i = 0; i < specs().size(); ++i)
    if (specs()[i].name == name) return params()[i];
  return Tensor();
}

int Decoder::open_sequence() {
  const int id = book_.open();
  shard_.open(id);
  return id;
}

int Decoder::copy_sequence(int from) {
  TROUPE_CHECK(book_.is_open(from), "Decoder: no sequence " + std::to_string(from));
  const int id = book_.open();
  shard_.copy(from, id);
  book_.grow(id, book_.length(from));
  return id;
}

void Decoder::close_sequence(int id) {
  book_.close(id);
  shard_.close(id);  // its cache is kept for the next sequence opened in its slot
}

int64_t Decoder::length(int id) const { return book_.length(id); }

Result<std::vector<std::vector<float>>> Decoder::feed_each(Context& ctx, const std::vector<int>& ids,
                                                           const std::vector<std::vector<int32_t>>& tokens,
                                                           const std::vector<uint8_t>& every) {
  if (every.size() != ids.size()) return Status::bad_input("Decoder::feed: one every-token flag per sequence");
  auto rows = plan_feed(config(), ids, tokens, [&](int id) { return book_.is_open(id); },
                        [&](int id) { return book_.length(id); });
  if (!rows) return rows.status();
  const Tensor x = shard_.embed(ctx, rows.value(), tokens);
  shard_.layers(ctx, rows.value(), x);
  shard_.advance(rows.value());
  for (size_t i = 0; i < ids.size(); ++i) book_.grow(ids[i], static_cast<int64_t>(tokens[i].size()));
  return shard_.head(ctx, rows.value(), x, every);
}

}  // namespace troupe
