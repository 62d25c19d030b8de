// One shard of the decoder (model/decoder.hpp): tensor-parallel rank r of t over one pipeline stage's
// layers, with the stage's embedding and/or head, and the key/value cache of its own query groups.
// The whole model on one thread is the shard t = 1 with every layer, the embedding and the head
// (Decoder); a parallel decoder (actors/decode_actors.hpp) runs t x p of them, each on its own thread
// with its tensor-parallel group's communicator, and moves the hidden rows between stages.
//
// Megatron's split (model/params.hpp, gpt2_shard_specs): the embedding is vocabulary-parallel (a token
// outside the shard's rows contributes zeros; one all-reduce over the group), the fused qkv and the
// first MLP linear are column-parallel (the shard holds H/t heads and G/t key/value groups, and caches
// those), the attention's and the MLP's output linears row-parallel (partial sums, one all-reduce each,
// the bias added after), the head vocabulary-parallel (the shard's logits, then an all-gather). Norms,
// positions and the biases of the row-parallel linears are replicated.
//
// Mixture-of-experts layers (docs/MOE.md): the router on every row (replicated), each token to its top-k
// experts as moe_route decides without a capacity (dropless: a token's continuation must not depend
// on the rows fed beside it; training's capacity, where the model has one, belongs to a batch), the
// experts split like the MLP and their weighted outputs summed over the group once; PR-MoE's dense
// MLP mixed by its coefficient, the shared expert added.
//
// The caller owns the sequences' bookkeeping: it checks a feed (plan_feed) and gives every shard the
// same ids and rows in the same order; a shard keeps, per sequence id, its cache and how many tokens
// it holds.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "comm/communicator.hpp"
#include "kernels/context.hpp"
#include "kernels/cpu/gemm_packed.hpp"
#include "kernels/tensor.hpp"
#include "model/params.hpp"
#include "troupe/model_config.hpp"
#include "troupe/status.hpp"

namespace troupe {

struct DecoderShardSpec {
  int tp_size = 1, tp_rank = 0;
  int first_layer = 0, num_layers = 0;  // global transformer layers [first, first + num)
  bool embedding = true, head = true;
  // Parameters, activations and the key/value cache: f32, or bf16 / f16 as a mixed-precision run's
  // forward holds them (every op computes in fp32 and rounds its result once; the attention over the
  // cache and the logits stay fp32).
  DType dtype = DType::f32;
  // Experts: split like the MLP over the tensor-parallel group (false: expert-TP = TP), or whole, each
  // rank holding E/t of every MoE layer's experts (true: expert parallelism over the group, EP = t,
  // expert-TP = 1, as Megatron's --expert-model-parallel-size with --expert-tensor-parallel-size 1).
  bool expert_parallel = false;
  // The whole model: t = 1, every layer, the embedding and the head.
  static DecoderShardSpec whole(const GptConfig& config);
  // Tensor-parallel rank `tp_rank` of `tp_size` on pipeline stage `stage` of `stages` (Megatron's
  // layer split, model/gpt_chunk.hpp's chunk_layers).
  static DecoderShardSpec of(const GptConfig& config, int tp_size, int tp_rank, int stages, int stage);
};

// Why `config` cannot be decoded on t x p shards (empty: it can): heads, query groups and MLP widths
// (the experts' and the shared expert's too) that t divides, no more stages than layers; with
// expert_parallel, a model with experts whose every MoE layer's count t divides (the experts' width
// then need not be).
std::string check_decoder_layout(const GptConfig& config, int tp_size, int stages, bool expert_parallel = false);

// A feed's rows: the sequences' new tokens one after the other.
struct DecodeRows {
  std::vector<int> ids;          // sequence ids
  std::vector<int64_t> row0;     // ids.size() + 1 offsets: sequence i's rows are [row0[i], row0[i+1])
  int64_t rows() const { return row0.empty() ? 0 : row0.back(); }
  // Sequences [begin, end) of these rows, renumbered from row 0.
  DecodeRows part(size_t begin, size_t end) const;
};

// Checks a feed (one non-empty token list per open sequence, none twice, tokens in the vocabulary,
// each sequence within the model's positions given `length(id)` tokens before) and lays out its
// rows. `is_open(id)` says whether id names an open sequence.
Result<DecodeRows> plan_feed(const GptConfig& config, const std::vector<int>& ids,
                             const std::vector<std::vector<int32_t>>& tokens, const std::function<bool(int)>& is_open,
                             const std::function<int64_t(int)>& length);

class DecoderShard {
 public:
  // Parameters allocated (zero) for the shard's slice, f32; `tp` is the tensor-parallel group's
  // communicator (size spec.tp_size, rank spec.tp_rank), null when tp_size is 1.
  DecoderShard(const GptConfig& config, const DecoderShardSpec& spec, comm::Communicator* tp = nullptr);

  const GptConfig& config() const { return config_; }
  const DecoderShardSpec& spec() const { return spec_; }
  // The shard's parameters (spec.dtype): gpt2_shard_specs(config, t, r) of its layers, its
  // embedding's and its head's (a tied head holds wte), in that function's order.
  const std::vector<ParamSpec>& specs() const { return specs_; }
  const std::vector<Tensor>& params() const { return params_; }
  // Fills every parameter from the whole model's tensors: whole(name) returns the f32 tensor whose
  // leading elements are the global tensor `name` in row-major order (further rows: padding); a
  // 16-bit shard rounds them to nearest.
  void load_from_whole(const std::function<Tensor(const std::string&)>& whole);
  // Packs the f32 weights of the head and of the dense layers' linears once for the CPU's packed kernel
  // (kernels/cpu/gemm_packed.hpp; nothing where cpu::packed_gemm_kernel() is none or the shard is
  // 16-bit): the forward then reads the packed copies, which hold as much memory again as those
  // weights. Call after the parameters are filled (load_from_whole does); a parameter written
  // afterwards needs another call, else the forward keeps the values packed before.
  void pack_weights();

  // Sequence slots (ids chosen by the caller, any non-negative int).
  void open(int id);
  void close(int id);
  void copy(int from, int to);  // `to` opened holding `from`'s tokens so far
  int64_t length(int id) const;

  // The embedded rows of a feed (first stage): (rows, C).
  Tensor embed(Context& ctx, const DecodeRows& rows, const std::vector<std::vector<int32_t>>& tokens) const;
  // The stage's layers over `x` (rows, C), in place; each sequence's new keys and values join its
  // cache at its length.
  void layers(Context& ctx, const DecodeRows& rows, const Tensor& x);
  // Each sequence's length grows by its rows (after the feed's layers, on every shard).
  void advance(const DecodeRows& rows);
  // The head (last stage): per sequence, the logits over the real vocabulary of its last row, or
  // (every[i]) of each of its rows one after the other.
  std::vector<std::vector<float>> head(Context& ctx, const DecodeRows& rows, const Tensor& x,
                                       const std::vector<uint8_t>& every) const;

 private:
  struct Sequence {
    bool open = false;
    int64_t length = 0;
    std::vector<Tensor> kv;  // per layer of the shard: (max_positions, 2 G/t hs) rows [k | v], k rotated
  };
  struct Mlp {
    Tensor fc_w, fc_b, proj_w, proj_b;  // column-parallel, row-parallel
    bool defined() const { return fc_w.defined(); }
  };
  struct Layer {
    Tensor ln1_w, ln1_b, attn_w, attn_b, proj_w, proj_b, ln2_w, ln2_b;
    Mlp mlp;  // the dense MLP (an MoE layer: PR-MoE's, or none)
    // An MoE layer (moe false: dense): the router and PR-MoE's coefficient (replicated), the shared
    // expert and every expert (split like the MLP: expert-TP = TP).
    bool moe = false;
    Tensor router_w, router_b, coef_w, coef_b;
    Mlp shared;
    std::vector<Mlp> experts;  // the shard's: global experts [expert0, expert0 + size) of the router's E
    int64_t expert0 = 0;
  };
  void norm(Context& ctx, const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& b) const;
  // out = x w^T (+ b): column-parallel (the shard's slice) or, row_parallel, summed over the group.
  void linear(Context& ctx, const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& b, bool row_parallel) const;
  void all_reduce(const Tensor& t, const char* what) const;
  // out (R, O) += bias (O), in fp32, rounded once.
  void add_bias(const Tensor& out, const Tensor& bias) const;
  // out = the MLP of `a` (R, C), summed over the group (the bias of c_proj added once).
  void mlp(Context& ctx, const Mlp& m, const Tensor& a, const Tensor& out) const;
  // out = an MoE layer's MLP of `a`: every token to its top-k experts, dropless (moe_route with no
  // capacity: a token's experts do not depend on the other rows of the feed).
  void moe_mlp(Context& ctx, const Layer& p, const Tensor& a, const Tensor& out) const;
  Sequence& sequence(int id);
  const Sequence& sequence(int id) const;
  // A (shape, dtype) tensor over grow-only buffer `slot`, kept across calls: the MLP's (rows, ffn)
  // intermediates are the prefill's largest, and fresh ones each layer cost page faults.
  Tensor scratch(size_t slot, const Shape& shape, DType dtype) const;

  GptConfig config_;
  DecoderShardSpec spec_;
  comm::Communicator* tp_ = nullptr;
  int64_t heads_ = 0, groups_ = 0;  // this shard's
  std::vector<ParamSpec> specs_;
  std::vector<Tensor> params_;
  Tensor wte_, wpe_, ln_embd_w_, ln_embd_b_, lnf_w_, lnf_b_, head_;
  int64_t vocab_begin_ = 0;  // the first (padded) vocabulary row wte_ and head_ hold
  std::vector<Layer> layers_;
  std::vector<double> alibi_;  // this shard's heads' slopes
  std::vector<Sequence> sequences_;
  mutable std::vector<Tensor> scratch_;  // bytes; the shard runs on one thread at a time
  std::unordered_map<const void*, cpu::PackedWeight> packed_;  // by the weight's data: pack_weights()
};

}  // namespace troupe
