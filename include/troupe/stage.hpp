// Custom stages: a user's own layer, block or whole model placed in troupe's pipeline, beside the
// built-in GPT blocks or instead of them.
//
// A model is a list of virtual pipeline stages (pp x v of them, in pipeline order: virtual stage
// k = chunk * pp + stage, as include/troupe/schedule.hpp numbers them), each a sequence of blocks. A
// block is a run of the built-in GPT (layers, with the token embedding and/or GPT's own head) or a
// user's Stage. Between two virtual stages, and between two blocks of one, flow named tensors: the
// outputs() of one are the inputs() of the next (same names, shapes and element types, checked
// before anything runs). The first block reads the batch; the last one returns the loss.
//
//   troupe::Model m = troupe::gpt_model(cfg, /*with_head=*/false);   // GPT's layers over pp x v
//   m.stages.back().push_back(troupe::Block::custom("zloss_head", [](const troupe::StagePlace& at) {
//     return std::make_unique<MyHead>(at);                            // a troupe::Stage
//   }));
//   troupe::RunOptions run;
//   run.model = std::make_shared<troupe::Model>(std::move(m));
//   troupe::train(cfg, data, callbacks, run);
//
// What troupe does for a custom stage, as for its own blocks:
//   parameters   allocated and initialised by troupe from their ParamDecl, in global coordinates:
//                any layout, and any tensor-parallel slice of a parameter, gets the same values for
//                the same (seed, name, element); saved and loaded by global name (checkpoints reload
//                on any layout); partitioned by ZeRO 1-3 (ZeRO-3 gathers them for each call) and
//                updated by AdamW; the gradient norm counts them once.
//   schedules    every schedule runs custom stages (1F1B, GPipe, interleaved, zero-bubble). Under
//                the zero-bubble schedule (ZB-H1) a stage that splits_backward() computes its input
//                gradients in backward and its weight gradients in backward_weight, the W pass;
//                one that does not computes both in backward (its W pass does nothing).
//   recompute    --recompute-granularity full: troupe calls forward with slot -1 during the forward
//                pass (nothing kept) and again with the slot right before backward; selective
//                recomputes nothing in a custom block (it is the attention core's).
//   tensor       a ParamDecl with tp_split_dim >= 0 is split in tp_size equal blocks along that
//   parallel     dimension; the stage gets its rank's block and combines partial results with
//                StageContext::all_reduce. The stage's inputs and outputs are whole on every
//                tensor-parallel rank (the rank's replicas compute the same outputs).
//
// Contract of a Stage (the engine checks shapes; the rest is the stage's to keep):
//   - forward and backward are deterministic functions of their arguments and the slot's saved
//     state (recompute and the layout-equivalence of results rely on it);
//   - forward with slot s >= 0 may keep what backward(s) needs; the slots in flight at once are
//     0 .. StagePlace::slots - 1, and backward(s) is called once after forward(s), in any order
//     between slots; slot -1 (evaluation, or the recompute's first pass) keeps nothing;
//   - the batch, inputs and outputs given to forward(s) stay valid and unchanged until backward(s)
//     returns (a stage may keep pointers to them instead of copies); parameter and gradient views
//     are valid only during the call that gets them (ZeRO-3 gathers parameters for each call);
//   - backward adds (+=) the parameter gradients into param_grads (they accumulate over the
//     micro-batches of an iteration) and writes (=) the input gradients; with the split (args.
//     weight_grads_later) backward writes the input gradients only and backward_weight(slot), called
//     later, adds the parameter gradients: the slot's batch, inputs and output gradients stay valid
//     until backward_weight returns;
//   - inputs (forward) and output gradients (backward) are read-only views (ConstTensorView);
//   - the loss: forward of the block with has_loss() returns the sum of its loss terms over the
//     micro-batch's first valid_samples samples (all of them in training), and backward computes the
//     gradients of loss_scale x that sum. troupe divides the job's loss sum by the global batch's
//     samples x Model::loss_terms_per_sample for the reported loss; loss_scale is its reciprocal;
//   - collectives (StageContext::all_reduce) are called in the same order on every tensor-parallel
//     rank of the stage.
// Threading: troupe calls a stage from the rank's own thread only, never concurrently; a stage may
// use StageContext::gemm, which runs on the rank's compute threads. Errors: a stage that cannot go
// on throws (std::exception); the rank fails with the message and the job stops.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "troupe/status.hpp"

namespace troupe {

struct TrainConfig;

enum class ElementType : uint8_t { f32, i32 };

// A tensor flowing between blocks, per micro-batch.
struct TensorDecl {
  std::string name;
  std::vector<int64_t> shape;
  ElementType type = ElementType::f32;
  // The gradient flows back through it (f32 only). false: masks, labels, positions, ids, any
  // value the loss does not differentiate.
  bool requires_grad = true;
};

// A parameter of a custom stage, in global (layout-free) terms.
struct ParamDecl {
  enum class Init : uint8_t { normal, zeros, ones };
  std::string name;           // global and unique in the model, e.g. "head.proj.weight"
  std::vector<int64_t> shape; // global shape
  // Tensor-parallel split: -1 replicated on every TP rank; d >= 0: dimension d is cut into tp_size
  // equal blocks (it must divide) and TP rank r holds block r.
  int tp_split_dim = -1;
  Init init = Init::normal;
  double init_std = 0.02;     // normal: N(0, init_std)
  bool weight_decay = true;   // AdamW's decoupled decay (false for biases and norms, as Megatron)
};

// A view of host memory: row-major, contiguous; data null and shape empty for "none".
template <class T>
struct View {
  T* data = nullptr;
  std::vector<int64_t> shape;
  int64_t numel() const {
    int64_t n = data ? 1 : 0;
    for (int64_t d : shape) n *= d;
    return n;
  }
  T& operator[](int64_t i) const { return data[i]; }
  explicit operator bool() const { return data != nullptr; }
};

// A boundary tensor's view: f32 or i32 by its TensorDecl. TensorView is one a stage writes (forward's
// outputs, backward's input gradients); ConstTensorView one it only reads (forward's inputs,
// backward's output gradients).
struct TensorView {
  void* data = nullptr;
  std::vector<int64_t> shape;
  ElementType type = ElementType::f32;
  View<float> f32() const;          // throws std::logic_error when type is not f32
  View<int32_t> i32() const;        // throws std::logic_error when type is not i32
  explicit operator bool() const { return data != nullptr; }
};
struct ConstTensorView {
  const void* data = nullptr;
  std::vector<int64_t> shape;
  ElementType type = ElementType::f32;
  View<const float> f32() const;    // throws std::logic_error when type is not f32
  View<const int32_t> i32() const;  // throws std::logic_error when type is not i32
  explicit operator bool() const { return data != nullptr; }
};

// Where a stage sits, given to its factory.
struct StagePlace {
  int virtual_stage = 0, virtual_stages = 1;  // k of pp x v
  int tp_rank = 0, tp_size = 1;
  int micro_batch = 1;        // B: samples per micro-batch
  int64_t record_length = 0;  // int32 values per sample of the data (seq_length + 1)
  int slots = 1;              // forward slots in flight at once (0 .. slots - 1)
  // TrainConfig::model's sizes as the job resolved them (the vocabulary from the tokenizer).
  int64_t hidden_size = 0, vocab_size = 0;
};

// What a stage may call while troupe runs it.
class StageContext {
 public:
  virtual ~StageContext() = default;
  virtual int tp_rank() const = 0;
  virtual int tp_size() const = 0;
  enum class Reduce : uint8_t { sum, max };
  // In place over the stage's tensor-parallel group (a no-op at tp 1). Every TP rank calls the
  // same sequence of all_reduce with the same n. A failed collective throws.
  virtual void all_reduce(float* data, int64_t n, Reduce op = Reduce::sum) = 0;
  virtual void all_reduce(double* data, int64_t n, Reduce op = Reduce::sum) = 0;
  // C (M, N) = alpha op(A) op(B) + beta C, row-major, on the rank's compute threads; the result is
  // bitwise the same for any thread count.
  virtual void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                    int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) = 0;
};

struct ForwardArgs {
  int slot = -1;                   // -1: keep nothing (evaluation, recompute's first pass)
  std::vector<View<const float>> params;  // this rank's slices, parameters() order
  View<const int32_t> batch;       // (B, record_length) when reads_batch(), else none
  std::vector<ConstTensorView> inputs;  // inputs() order (read only)
  std::vector<TensorView> outputs; // outputs() order: fill every element
  int64_t valid_samples = 0;       // has_loss: sum the loss of samples [0, valid_samples) only
  double loss_scale = 0;           // what backward scales the loss by (1 / the global batch's terms)
};

struct BackwardArgs {
  int slot = 0;
  std::vector<View<const float>> params;
  // parameters() order: add (+=) into them. Empty in a backward with weight_grads_later (they come
  // in backward_weight's).
  std::vector<View<float>> param_grads;
  View<const int32_t> batch;
  std::vector<ConstTensorView> output_grads;  // outputs() order; none for outputs without gradient
  // inputs() order: write (=); none without gradient. Empty in backward_weight's.
  std::vector<TensorView> input_grads;
  double loss_scale = 0;
  // The zero-bubble split (splits_backward()): this backward writes the input gradients only and
  // keeps what the weight gradients need; backward_weight(slot) adds them later.
  bool weight_grads_later = false;
};

class Stage {
 public:
  virtual ~Stage() = default;
  // Called once, when troupe builds the stage; must not change afterwards.
  virtual std::vector<TensorDecl> inputs() const = 0;   // empty for the model's first block
  virtual std::vector<TensorDecl> outputs() const = 0;  // empty for the block with the loss
  virtual std::vector<ParamDecl> parameters() const = 0;
  virtual bool reads_batch() const { return false; }    // gets the micro-batch's samples
  virtual bool has_loss() const { return false; }       // the model's last block
  // Returns the loss sum when has_loss(), else 0.
  virtual double forward(StageContext& ctx, const ForwardArgs& args) = 0;
  virtual void backward(StageContext& ctx, const BackwardArgs& args) = 0;
  // The zero-bubble schedules' split backward (Qi et al., ZB-H1): true when this stage computes its
  // weight gradients apart, in backward_weight. Then, under --pipeline-schedule zb-h1, backward is
  // called with weight_grads_later and no param_grads, and backward_weight later for the same slot
  // with params, param_grads, the batch and the output gradients (no input gradients). Under every
  // other schedule (and with false) backward computes both.
  virtual bool splits_backward() const { return false; }
  virtual void backward_weight(StageContext& ctx, const BackwardArgs& args) { (void)ctx, (void)args; }
};

// Makes the stage of one place: once per tensor-parallel rank that holds it, and once more (tp rank
// 0) when troupe checks the model before the run, so it should be cheap and free of side effects.
using StageFactory = std::function<std::unique_ptr<Stage>(const StagePlace&)>;

// One block of a virtual stage.
struct Block {
  enum class Kind : uint8_t { gpt, custom };
  Kind kind = Kind::gpt;
  // gpt: layers [first_layer, first_layer + num_layers) of TrainConfig::model; `embedding` (the
  // model's first block: token and position embeddings), `head` (the model's last block: ln_f, the
  // output layer tied to the token embedding, cross-entropy over seq_length tokens per sample).
  // Its input and output are {"hidden", {B * seq_length, hidden_size}, f32}.
  int first_layer = 0, num_layers = 0;
  bool embedding = false, head = false;
  // custom
  std::string name;
  StageFactory make;

  static Block gpt(int first_layer, int num_layers, bool embedding, bool head);
  static Block custom(std::string name, StageFactory make);
};

struct Model {
  std::vector<std::vector<Block>> stages;  // pp x v virtual stages, each one or more blocks
  // Loss terms per sample, the divisor of the loss sum (with the global batch's samples); 0: the
  // config's seq_length (a loss per token, as GPT's head).
  int64_t loss_terms_per_sample = 0;
};

// GPT's own model as troupe train builds it: config.model's layers over pp x v virtual stages
// (the first (L mod pp*v) get one more), the embedding on the first, GPT's head on the last unless
// with_head is false (then the model needs a custom block with the loss after it). v from the
// config's interleaving (num_layers_per_virtual_pipeline_stage).
Model gpt_model(const TrainConfig& config, bool with_head = true);

// A block of your own in GPT's model: after_layer -1 puts it right after the token embedding (before
// layer 0), k after GPT layer k (0-based), num_layers - 1 after the last layer, before GPT's head,
// which stays. It sits on the virtual stage of the layer before it (the embedding's for -1); the
// layers around it keep GPT's split. Such a block takes and gives {"hidden", {B * seq_length,
// hidden_size}, f32}.
struct Insertion {
  int after_layer = 0;
  Block block;
};

// GPT's model as gpt_model(config, with_head) builds it, with `insertions` in place (several after
// one layer go in the order given). An after_layer outside -1 .. num_layers - 1 is bad input.
Result<Model> gpt_model(const TrainConfig& config, const std::vector<Insertion>& insertions, bool with_head = true);

}  // namespace troupe
