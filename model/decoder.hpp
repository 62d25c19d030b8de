// Decoder: the transformer run forward for generation, with a key/value cache per sequence
// (docs/SERVE.md). The same blocks as the training model (reference/gpt.hpp lists them: GPT-2,
// LLaMA, BLOOM), on one shard's whole parameters (the tp = 1 specs of model/params.hpp, f32), built
// from the same kernels: norms, the fused qkv linear, rotary on q and k at each token's position,
// causal attention of the new tokens over the cache (ops::attention_block_*: any query and key
// positions, ALiBi, grouped-query), the MLP, and the head on each sequence's last token only.
//
// Sequences are independent: feed() takes a few new tokens for each of several sequences (a prompt
// of any length, or one generated token), runs every linear layer over all their rows at once, the
// attention sequence by sequence against its own cache, and returns each sequence's next-token
// logits. Feeding a sequence token by token gives the logits of feeding it whole up to rounding
// (tests/model/test_decoder.cpp); the training model's loss over a sequence equals the sum of its
// log-probabilities here.
//
// The computation is model/decoder_shard.hpp's, the whole model as one shard.
//
// Not thread-safe; one owner (a generation actor or command) calls it.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/context.hpp"
#include "kernels/tensor.hpp"
#include "model/decoder_shard.hpp"
#include "model/params.hpp"
#include "troupe/model_config.hpp"
#include "troupe/status.hpp"

namespace troupe {

// What generation needs of a decoder (model/generation.hpp): sequences with a key/value cache, fed new
// tokens, giving next-token logits. Decoder runs it on one thread; ParallelDecoder
// (actors/decode_actors.hpp) on tensor- and pipeline-parallel shards that are actors.
class SequenceDecoder {
 public:
  virtual ~SequenceDecoder() = default;
  virtual const GptConfig& config() const = 0;
  // A new empty sequence (its cache grows to the model's max_position_embeddings); its id.
  virtual int open_sequence() = 0;
  virtual void close_sequence(int id) = 0;
  // A new sequence holding a copy of sequence `id`'s tokens so far (its cache copied): a beam's fork.
  virtual int copy_sequence(int id) = 0;
  virtual int64_t length(int id) const = 0;  // tokens fed so far
  // Appends tokens[i] to sequence ids[i] (each non-empty; the sequence's length plus its tokens at
  // most max_position_embeddings: bad input otherwise) and returns, per sequence, the logits of
  // its last token over the real vocabulary (vocab_size floats); with every[i], of each of its new
  // tokens one after the other (tokens[i].size() x vocab_size floats).
  virtual Result<std::vector<std::vector<float>>> feed_each(Context& ctx, const std::vector<int>& ids,
                                                            const std::vector<std::vector<int32_t>>& tokens,
                                                            const std::vector<uint8_t>& every) = 0;
  // feed_each with every_token for every sequence.
  Result<std::vector<std::vector<float>>> feed(Context& ctx, const std::vector<int>& ids,
                                               const std::vector<std::vector<int32_t>>& tokens, bool every_token = false) {
    return feed_each(ctx, ids, tokens, std::vector<uint8_t>(ids.size(), every_token ? 1 : 0));
  }
};

// Sequence ids and lengths as a decoder's owner keeps them: ids reused lowest first.
class SequenceBook {
 public:
  int open();
  void close(int id);
  bool is_open(int id) const;
  int64_t length(int id) const;  // an id that is not open is a bug
  void grow(int id, int64_t tokens);

 private:
  std::vector<int64_t> length_;  // -1: closed
};

class Decoder : public SequenceDecoder {
 public:
  // Parameters allocated (zero) for `config`, in `dtype` (f32, or bf16 / f16: the 16-bit forward,
  // model/decoder_shard.hpp). Fill them through params() (by spec name, e.g. from a checkpoint) or
  // load_from.
  explicit Decoder(const GptConfig& config, DType dtype = DType::f32);
  // Why `config` cannot be decoded here (empty: it can).
  static std::string check(const GptConfig& config);

  const GptConfig& config() const override { return shard_.config(); }
  const std::vector<ParamSpec>& specs() const { return shard_.specs(); }
  const std::vector<Tensor>& params() const { return shard_.params(); }  // spec order, f32, whole (tp = 1)
  // The parameter named `name` (empty when the model has none).
  Tensor param(const std::string& name) const;
  DType dtype() const { return shard_.spec().dtype; }
  // Every parameter from an f32 decoder of the same model (rounded to this one's type).
  void load_from(const Decoder& whole);
  // The forward's linears read their f32 weights packed once (DecoderShard::pack_weights): call after
  // filling params() (load_from does), again after writing them.
  void pack_weights() { shard_.pack_weights(); }

  int open_sequence() override;
  void close_sequence(int id) override;
  int copy_sequence(int id) override;
  int64_t length(int id) const override;
  Result<std::vector<std::vector<float>>> feed_each(Context& ctx, const std::vector<int>& ids,
                                                    const std::vector<std::vector<int32_t>>& tokens,
                                                    const std::vector<uint8_t>& every) override;

 private:
  DecoderShard shard_;
  SequenceBook book_;
};

}  // namespace troupe
