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
// Not thread-safe; one owner (a generation actor or command) calls it.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/context.hpp"
#include "kernels/tensor.hpp"
#include "model/params.hpp"
#include "troupe/model_config.hpp"
#include "troupe/status.hpp"

namespace troupe {

class Decoder {
 public:
  // Parameters allocated (zero) for `config` (a dense model: mixture-of-experts layers are refused
  // by check()). Fill them through params() (by spec name, e.g. from a checkpoint).
  explicit Decoder(const GptConfig& config);
  // Why `config` cannot be decoded here (empty: it can).
  static std::string check(const GptConfig& config);

  const GptConfig& config() const { return config_; }
  const std::vector<ParamSpec>& specs() const { return specs_; }
  const std::vector<Tensor>& params() const { return params_; }  // spec order, f32, whole (tp = 1)

  // A new empty sequence (its cache grows to the model's max_position_embeddings); its id.
  int open_sequence();
  void close_sequence(int id);
  // A new sequence holding a copy of sequence `id`'s tokens so far (its cache copied): a beam's fork.
  int copy_sequence(int id);
  int64_t length(int id) const;  // tokens fed so far

  // Appends tokens[i] to sequence ids[i] (each non-empty; the sequence's length plus its tokens at
  // most max_position_embeddings: bad input otherwise) and returns, per sequence, the logits of
  // its last token over the real vocabulary (vocab_size floats); with every_token, of each of its
  // new tokens one after the other (tokens[i].size() x vocab_size floats).
  Result<std::vector<std::vector<float>>> feed(Context& ctx, const std::vector<int>& ids,
                                               const std::vector<std::vector<int32_t>>& tokens,
                                               bool every_token = false);

 private:
  struct Sequence {
    bool open = false;
    int64_t length = 0;
    std::vector<Tensor> kv;  // per layer (max_positions, 2 G hs): [k | v] rows, k rotated
  };
  struct Layer {
    Tensor ln1_w, ln1_b, attn_w, attn_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fcproj_w, fcproj_b;
  };
  void norm(Context& ctx, const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& b) const;

  GptConfig config_;
  std::vector<ParamSpec> specs_;
  std::vector<Tensor> params_;
  Tensor wte_, wpe_, ln_embd_w_, ln_embd_b_, lnf_w_, lnf_b_, head_;
  std::vector<Layer> layers_;
  std::vector<double> alibi_;
  std::vector<Sequence> sequences_;
};

}  // namespace troupe
