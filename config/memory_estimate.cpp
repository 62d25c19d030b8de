#include "config/memory_estimate.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <unistd.h>

#include "troupe/schedule.hpp"

namespace troupe {

namespace {

double gib(double bytes) { return bytes / (1024.0 * 1024.0 * 1024.0); }

// "1.5 GiB", "12.3 MiB": the plan's sizes in the unit that reads.
std::string size_text(double bytes) {
  if (bytes >= 1024.0 * 1024 * 1024) return fmt::format("{:.3g} GiB", gib(bytes));
  return fmt::format("{:.3g} MiB", bytes / (1024.0 * 1024.0));
}

// "6.74 G", "85.3 M", "69744": a parameter count.
std::string count_text(double n) {
  if (n >= 1e9) return fmt::format("{:.3g} G", n / 1e9);
  if (n >= 1e6) return fmt::format("{:.3g} M", n / 1e6);
  return fmt::format("{:.0f}", n);
}

// A number from a one-value file (cgroup v2: "max" means no limit); negative when unreadable.
double read_number(const char* path) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word) || word == "max") return -1;
  char* end = nullptr;
  const double v = std::strtod(word.c_str(), &end);
  return end != nullptr && *end == '\0' ? v : -1;
}

// The activation slots of each (stage, chunk) as the rank engine uses them (Schedule::slots_held:
// what the engine allocates for the chunk, on a device too, and writes). Tables are made once per
// (schedule, p, m, v) and kept; one too large to make (over a million actions) gets none, and the
// caller falls back on the closed forms.
struct SlotCounts {
  std::vector<std::vector<int>> held;  // [stage][chunk]
};

std::shared_ptr<const SlotCounts> schedule_slots(const std::string& type_name, int p, int m, int v,
                                                 const std::vector<int>& ramp) {
  auto type = sched::parse_schedule(type_name);
  const double actions = static_cast<double>(p) * m * v * 3;
  if (!type.is_ok() || p < 1 || m < 1 || v < 1 || actions > 1e6 || actions * static_cast<double>(ramp.size()) > 1e7)
    return nullptr;
  static std::mutex mutex;
  static std::map<std::tuple<int, int, int, int, std::vector<int>>, std::shared_ptr<const SlotCounts>> made;
  const auto key = std::make_tuple(static_cast<int>(type.value()), p, m, v, ramp);
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (auto it = made.find(key); it != made.end()) return it->second;
  }
  sched::ScheduleSpec spec;
  spec.type = type.value();
  spec.stages = p;
  spec.micro_batches = m;
  spec.chunks = type.value() == sched::ScheduleType::interleaved ? v : 1;
  auto table = sched::make_schedule(spec);
  if (!table.is_ok()) return nullptr;
  auto counts = std::make_shared<SlotCounts>();
  for (int s = 0; s < p; ++s) counts->held.push_back(sched::engine_slots(table.value(), s, ramp));
  std::lock_guard<std::mutex> lock(mutex);
  if (made.size() > 4096) made.clear();
  made.emplace(key, counts);
  return counts;
}

}  // namespace

const StageMemory& MemoryEstimate::largest_stage() const {
  static const StageMemory none;
  if (stages.empty()) return none;
  return *std::max_element(stages.begin(), stages.end(),
                           [](const StageMemory& a, const StageMemory& b) { return a.total() < b.total(); });
}

MemoryEstimate estimate_memory(const TrainConfig& c, int world_size, const std::vector<StageFootprint>* model) {
  const GptConfig& m = c.model;
  const int tp_size = std::max(1, c.tensor_model_parallel_size);
  const double t = tp_size, p = std::max(1, c.pipeline_model_parallel_size);
  const double d = std::max(1, c.resolved_dp(std::max(1, world_size)));
  // Context parallelism: a rank holds T / cp rows of every sequence; the parameters are replicated
  // over cp as over dp, so ZeRO partitions over d x cp ranks.
  const double cp = c.sequence_ranks();
  // All-to-all attention (Ulysses, --cp-comm-type a2a) runs whole sequences of H / cp heads: the
  // probabilities per local token stay H T / t, and it keeps the gathered q, k, v besides.
  const bool a2a = cp > 1 && (c.ds_sequence_parallel_size > 1 || c.cp_comm_type == "a2a");
  const double C = m.hidden_size, L = std::max(1, m.num_layers), H = m.num_attention_heads, T = m.seq_length;
  const double G = m.query_groups(), hs = m.head_size(), F = m.ffn_hidden_size();
  const double Vp = static_cast<double>(m.padded_vocab_size(tp_size)), P = m.max_position_embeddings;
  const bool swiglu = m.activation == MlpActivation::swiglu;
  const double norm = m.normalization == Normalization::rmsnorm ? C : 2 * C;  // weight (+ bias)
  const double qkv = (H + 2 * G) * hs, attn = H * hs;

  // One layer on one tensor-parallel rank: column-parallel qkv and fc1 (weights and biases) and
  // row-parallel projection and fc2 split 1/t; the norms and the row-parallel biases whole. An MoE
  // layer's MLP: the router whole, E/ep experts of width Fe split over expert-TP (t or 1), PR-MoE's
  // dense MLP split like the MLP with its coefficient whole, the shared expert split like the MLP.
  const MoeConfig& moe = m.moe;
  const double ep = std::max(1, c.expert_model_parallel_size);
  const double et = c.expert_tensor_parallel_size == 1 ? 1 : t;  // 0: Megatron-Core's default, TP
  const double Fe = m.expert_ffn_hidden_size();
  const double attention = 2 * norm + (C * qkv + attn * C) / t + (m.add_bias_linear ? qkv / t + C : 0);
  auto mlp = [&](double width, double split) {  // c_fc, c_proj and their biases on one rank
    const double fc = swiglu ? 2 * width : width;
    return (C * fc + width * C) / split + (m.add_bias_linear ? fc / split + C : 0);
  };
  const double mlp_act = swiglu ? 3 : 2;  // per unit of width: fc1's output(s) and the activation
  struct Layer {
    double dense = 0;    // parameters every data-parallel rank holds
    double experts = 0;  // the experts' parameters (states partitioned over the d / ep ranks of their group)
    double split = 0;    // activation floats per token of the tensor-parallel part (see the header)
  };
  auto layer_of = [&](int l) {
    Layer y;
    const double E = moe.experts_of(l, m.num_layers);
    y.dense = attention;
    y.split = (qkv + attn) / t + (a2a ? qkv / t : 0);
    if (E == 0) {
      y.dense += mlp(F, t);
      y.split += mlp_act * F / t;
      return y;
    }
    y.dense += E * C + (m.add_bias_linear && moe.router == MoeRouter::megatron ? E : 0);
    y.experts = E / ep * mlp(Fe, et);
    // Each token's k expert activations (dropless; a capacity only lowers it), its router logits and
    // probabilities; the k rows gathered to their experts and the experts' outputs (MoeActs::xd, y),
    // and over ep > 1 the outputs of this rank's own assignments sent back (y_mine).
    y.split += moe.topk * mlp_act * Fe / et + 2 * E + moe.topk * C * (2 + (ep > 1 ? 1 : 0));
    if (moe.residual) {
      y.dense += mlp(F, t) + 2 * C + 2;
      y.split += mlp_act * F / t + 2;
    }
    if (moe.shared_expert_ffn > 0) {
      y.dense += mlp(moe.shared_expert_ffn, t);
      y.split += mlp_act * moe.shared_expert_ffn / t;
    }
    return y;
  };
  double embedding = Vp / t * C;  // wte's rows of the padded vocabulary
  if (m.position_embedding == PositionEmbedding::learned_absolute) embedding += P * C;
  if (m.embed_layernorm) embedding += norm;
  // The head: ln_f, and lm_head (untied) or the tied copy of wte the last stage keeps when p > 1.
  const double head = norm + (m.untie_embeddings_and_output_weights || p > 1 ? Vp / t * C : 0);

  // Bytes per parameter: the working weights a, their gradients g and the optimizer's o (Adam's two
  // fp32 moments; under mixed precision also the fp32 master weights, and the fp32 main gradients of
  // the owned range when the gradients are 16-bit).
  const bool mixed = c.precision.sixteen_bit();
  const double a = mixed ? 2 : 4;
  const double g = mixed && c.precision.grad_dtype(c.zero_stage) != PrecisionDType::fp32 ? 2 : 4;
  const double o = mixed ? 12 + (g == 2 ? 4 : 0) : 8;
  const double act = mixed ? 2 : 4;  // bytes of one activation element
  // ZeRO partitions over the `dp` ranks that hold the same parameters: d, or d / ep for experts.
  // The model states of psi parameters partitioned over dp ranks, as {weights, gradients, optimizer}.
  struct States {
    double weights = 0, gradients = 0, optimizer = 0;
  };
  auto states_of = [&](double psi, double dp) {
    const int z = c.zero_stage;
    // ZeRO-1 keeps the whole gradients and, over more than one rank, the partition its reduce-scatter
    // writes (engine/zero_store.cpp: the optimizer's views point into it).
    States st{a * psi / (z >= 3 ? dp : 1), g * psi / (z >= 2 ? dp : 1) + (z == 1 && dp > 1 ? g * psi / dp : 0),
              o * psi / (z >= 1 ? dp : 1)};
    if (c.offload_optimizer == "nvme") st.optimizer -= 8 * psi / dp;  // the moments live in swap files
    return st;
  };

  // Activations, floats per token of one layer (Korthikanti et al.'s terms, see the header).
  const double whole = c.sequence_parallel && tp_size > 1 ? 4 * C / t : 4 * C;
  // The attention's saved state per token: the probabilities (H/t rows of T), or under context
  // parallelism each row's log-sum-exp (ring attention keeps no (T, T) matrix).
  const double probs = cp > 1 && !a2a ? H / t : H * T / t;
  const double micro = std::max(1, c.micro_batch_size);
  const double tokens = micro * T / cp;
  // The sums over layers [first, first + n) of their parameters and of whole + split, and the largest
  // layer's whole + split + probs: n times one layer for a dense model, layer by layer with experts.
  struct Sums {
    double dense = 0, experts = 0, floats = 0, largest = 0;
    double unit = 0;  // the largest ZeRO unit among the layers: a layer's dense parameters or its experts
  };
  auto sums_of = [&](int first, int n) {
    Sums u;
    if (n <= 0) return u;
    if (!moe.enabled()) {
      const Layer y = layer_of(first);
      u = {n * y.dense, 0, n * (whole + y.split), whole + y.split + probs, y.dense};
      return u;
    }
    for (int l = first; l < first + n; ++l) {
      const Layer y = layer_of(l);
      u.dense += y.dense;
      u.experts += y.experts;
      u.floats += whole + y.split;
      u.largest = std::max(u.largest, whole + y.split + probs);
      u.unit = std::max({u.unit, y.dense, y.experts});
    }
    return u;
  };
  // One micro-batch's activations on a stage of n layers.
  auto micro_batch_bytes = [&](const Sums& u, double n, const std::string& recompute) {
    double floats = 0;
    if (n <= 0) floats = 0;
    else if (recompute == "full") floats = n * C + u.largest;
    else if (recompute == "selective") floats = u.floats + probs;
    else floats = u.floats + n * probs;
    return act * tokens * floats;
  };
  const double micro_batches = std::max(1.0, static_cast<double>(c.global_batch_size) / (micro * d));

  MemoryEstimate e;
  e.logits_bytes = act * tokens * Vp / t;
  // Ring attention's scratch (cp > 1, p2p or all_gather): each compute thread of a rank holds the
  // scores of a tile of 128 query rows against a key block, 128 T/cp elements, 2 of them in the
  // backward (4 with attention dropout), in f32 (the kernel widens 16-bit activations).
  // The CPU's whole-sequence kernel (no cp, or the all-to-all's whole sequences of H / (t cp) heads)
  // holds a (T, T) dP per busy thread in the backward, (2 T + 1) T with attention dropout.
  const double threads = std::max(1.0, static_cast<double>(c.num_threads > 0 ? c.num_threads
                                                                          : std::thread::hardware_concurrency()));
  const double ranks_here = world_size > 1 ? 1.0 : std::max(1.0, t * p * d * cp);
  const double per_rank = std::max(1.0, std::floor(threads / ranks_here));
  if (cp > 1 && !a2a) {
    const double Tl = T / cp;
    const double tasks = micro * std::max(1.0, G / t);
    e.attention_scratch_bytes = std::min(per_rank, tasks) * (m.attention_dropout > 0 ? 4 : 2) * 128 * Tl * 4;
    // The ring's workspace (model/ring_attention.hpp, RingWorkspace), f32 per local token: the forward's
    // accumulator and dQ (Al each), the row statistics m, l and delta (H/t each), and the K/V blocks
    // of 2 G hs / t: two in hand and three of gradients (p2p), or the gathered blocks and their
    // gradients of all cp ranks besides this rank's and its gradient (all_gather).
    const double kv = 2 * G * hs / t;
    const double blocks = c.cp_comm_type == "all_gather" ? 2 + 2 * cp : 5;
    e.ring_workspace_bytes = 4 * tokens * (2 * attn / t + 3 * H / t + blocks * kv);
  } else if (c.device != "cuda") {
    const double tasks = micro * std::max(1.0, H / t / (a2a ? cp : 1));
    e.attention_scratch_bytes = std::min(per_rank, tasks) * (m.attention_dropout > 0 ? 2 * T + 1 : T) * T * 4;
  }
  // The chunk's scratch (model/gpt_chunk.cpp, Impl's constructor): buffers a rank holds once, whatever
  // the micro-batches in flight, which every training step writes. Floats per token: the backward's
  // gradients of one layer (d fc, d gelu, d qkv, d att and the four (rows, C) ones; those between the
  // TP regions 1/t of the rows under sequence parallelism) and d(layer input); the gathered rows and
  // the TP partial sums; with the all-to-all, the whole sequences' attention output and q, k, v
  // gradient (per local token: Al and QKVl) and the exchanges' send and receive staging (QKVl each). One layer's recompute buffers are in the recompute
  // terms above (full: `largest`; selective: the probabilities).
  const double sp_rows = c.sequence_parallel && tp_size > 1 ? 1 / t : 1;
  const bool moe_any = moe.enabled();
  double layer_scratch = F / t + attn / t + 2 * C + (swiglu ? 2 : 1) * F / t + qkv / t + 3 * C * sp_rows;
  if (c.sequence_parallel && tp_size > 1) layer_scratch += C;          // gathered
  if ((c.sequence_parallel && tp_size > 1) || moe_any) layer_scratch += C;  // partial
  if (a2a) layer_scratch += attn / t + 3 * qkv / t;  // and the all-to-alls' send and receive staging
  // An MoE layer's backward (model/gpt_chunk_moe.cpp) allocates per step d(expert outputs), the
  // gradients of the gathered rows and their scatter back, (k rows, C) each, two more over ep > 1
  // (this rank's assignments' before and after the exchange); the heap keeps them.
  if (moe_any) layer_scratch += moe.topk * C * (3 + (c.expert_model_parallel_size > 1 ? 2 : 0));
  layer_scratch *= act * tokens;
  // The first stage: d(embedding output), and under cp the position table's rows and their gradient;
  // the last: d(ln_f output), the partial sums and the per-token losses (f32).
  double embedding_scratch = act * tokens * C;
  if (cp > 1 && m.position_embedding == PositionEmbedding::learned_absolute)
    embedding_scratch += 2 * act * (T / cp) * C;
  const double head_scratch = act * tokens * (C * sp_rows + C) + 4 * tokens;
  const int64_t stages = static_cast<int64_t>(p), layers = static_cast<int64_t>(L);
  // What each pipeline stage holds: GPT's even split (stage s: floor(L / p) layers, one more for the
  // first L mod p stages; validation bounds p by L), or a model given in code, its virtual stage k on
  // pipeline stage k mod p. The GPT layers are numbered in order of the (virtual) stages.
  std::vector<StageFootprint> per_stage(static_cast<size_t>(stages));
  std::vector<Sums> held(static_cast<size_t>(stages));
  int next_layer = 0;
  auto take_layers = [&](size_t s, int n) {
    const Sums u = sums_of(next_layer, n);
    next_layer += n;
    held[s].dense += u.dense;
    held[s].experts += u.experts;
    held[s].floats += u.floats;
    held[s].largest = std::max(held[s].largest, u.largest);
    held[s].unit = std::max(held[s].unit, u.unit);
  };
  if (model == nullptr) {
    for (int64_t s = 0; s < stages; ++s) {
      per_stage[s].gpt_layers = static_cast<int>(layers / stages + (s < layers % stages ? 1 : 0));
      per_stage[s].embedding = s == 0;
      per_stage[s].head = s == stages - 1;
      take_layers(static_cast<size_t>(s), per_stage[s].gpt_layers);
    }
  } else {
    for (size_t k = 0; k < model->size(); ++k) {
      StageFootprint& f = per_stage[k % per_stage.size()];
      const StageFootprint& v = (*model)[k];
      f.gpt_layers += v.gpt_layers;
      f.embedding = f.embedding || v.embedding;
      f.head = f.head || v.head;
      f.custom_parameters += v.custom_parameters;
      f.custom_boundary_elements += v.custom_boundary_elements;
      take_layers(k % per_stage.size(), v.gpt_layers);
    }
  }
  const double first_layers = per_stage.empty() ? 0 : per_stage[0].gpt_layers;
  const Sums first_sums = held.empty() ? Sums{} : held[0];
  e.micro_batch_activation_none = micro_batch_bytes(first_sums, first_layers, "none");
  e.micro_batch_activation_selective = micro_batch_bytes(first_sums, first_layers, "selective");
  e.micro_batch_activation_full = micro_batch_bytes(first_sums, first_layers, "full");
  // The activation slots each stage's chunks hold (Schedule::slots_held, what the engine allocates
  // per chunk). A chunk's slot holds its share of the stage's layers;
  // the stage's figure is in stage-sized slots. Without a table (over a million actions), 1F1B's
  // closed form: min(p - s, m) in flight, one more taken ahead by a later stage's receive.
  const int chunks = model != nullptr ? std::max<int>(1, static_cast<int>(model->size() / per_stage.size()))
                     : c.pipeline_schedule == "interleaved" && c.num_layers_per_virtual_pipeline_stage > 0
                         ? std::max(1, m.num_layers / (static_cast<int>(p) * c.num_layers_per_virtual_pipeline_stage))
                         : 1;
  const double whole_micro_batches = std::floor(std::min(micro_batches, 1e9));
  // A batch-size ramp-up's smaller steps, as the job hands them to the engine (actors/job.cpp).
  std::vector<int> ramp;
  if (c.rampup() && c.rampup_batch_increment > 0)
    for (int64_t b = c.rampup_start_batch; b < c.global_batch_size && ramp.size() < 4096; b += c.rampup_batch_increment) {
      const int64_t count = b / static_cast<int64_t>(d) / std::max(1, c.micro_batch_size);
      if (count >= 1 && count < whole_micro_batches) ramp.push_back(static_cast<int>(count));
    }
  const std::shared_ptr<const SlotCounts> table =
      schedule_slots(c.pipeline_schedule, static_cast<int>(p), static_cast<int>(whole_micro_batches), chunks, ramp);
  auto slots_of = [&](int64_t s, int k) -> double {
    if (table && s < static_cast<int64_t>(table->held.size()) && k < static_cast<int>(table->held[s].size()))
      return std::max(1, table->held[s][k]);
    const double in_flight =
        c.pipeline_schedule == "gpipe" ? micro_batches : std::min(static_cast<double>(stages - s), micro_batches);
    return in_flight + (s > 0 && in_flight < micro_batches ? 1 : 0);
  };
  // zb-h1's split backward keeps, per slot, each layer's output gradients for its W pass
  // (GptChunk::Impl::LayerStash: dy2, dy1, d fc, d qkv on all rows; d ln2, d ln1 on this rank's),
  // and d(embedding output) / d(ln_f output) on the chunks that have them.
  const bool split_backward = c.pipeline_schedule == "zb-h1";
  const double stash_floats = 2 * C + 2 * C * sp_rows + (swiglu ? 2 : 1) * F / t + qkv / t;
  // The first 1023 stages and the last are kept for the plan.
  double sum_states = 0, sum_activations = 0;
  for (int64_t s = 0; s < stages; ++s) {
    StageMemory st;
    const StageFootprint& f = per_stage[static_cast<size_t>(s)];
    const Sums& u = held[static_cast<size_t>(s)];
    const double dense = u.dense + (f.embedding ? embedding : 0) + (f.head ? head : 0) + f.custom_parameters;
    st.parameters = dense + u.experts;
    const States dense_states = states_of(dense, d * cp), expert_states = states_of(u.experts, std::max(1.0, d * cp / ep));
    st.weight_bytes = dense_states.weights + expert_states.weights;
    st.gradient_bytes = dense_states.gradients + expert_states.gradients;
    st.optimizer_bytes = dense_states.optimizer + expert_states.optimizer;
    st.model_state_bytes = st.weight_bytes + st.gradient_bytes + st.optimizer_bytes;
    double slot_sum = 0;
    for (int k = 0; k < chunks; ++k) slot_sum += slots_of(s, k);
    st.micro_batches_in_flight = slot_sum / chunks;
    // A GPT layer's activations need one; a custom block's boundary tensors are all it is known to keep.
    // What recomputation rebuilds lives in one buffer of the chunk (model/gpt_chunk.cpp: `rc`), not in
    // each micro-batch's slot: full recompute's one layer of activations, selective's probabilities.
    // A slot keeps the rest (full: the layer inputs).
    const std::string& rc = c.recompute_granularity;
    const double rebuilt = f.gpt_layers <= 0 ? 0
                           : rc == "full"    ? act * tokens * u.largest
                           : rc == "selective" ? act * tokens * probs
                                               : 0;
    double micro_batch = micro_batch_bytes(u, f.gpt_layers, rc) - rebuilt + 4 * f.custom_boundary_elements;
    if (split_backward && f.gpt_layers > 0) micro_batch += act * tokens * f.gpt_layers * stash_floats;
    double stash_ends = 0;  // the embedding's and the head's gradients, in their chunks' slots
    if (split_backward && f.embedding)
      stash_ends += slots_of(s, 0) * act * tokens * (C + (m.embed_layernorm ? C * sp_rows : 0));
    if (split_backward && f.head) stash_ends += slots_of(s, chunks - 1) * act * tokens * C * sp_rows;
    // The rank engine's boundary buffers per slot of a GPT chunk (engine/rank_engine.cpp): the
    // activation received and its gradient sent back where the chunk has a stage before it, the
    // activation sent and the gradient received where it has one after it; (rows, C) each (a model
    // given in code is counted as GPT's hidden state crossing).
    double boundary = 0;
    for (int k = 0; k < chunks; ++k) {
      const bool has_input = s > 0 || k > 0, has_output = s < stages - 1 || k < chunks - 1;
      boundary += slots_of(s, k) * act * tokens * C * sp_rows * (2.0 * has_input + 2.0 * has_output);
    }
    // ZeRO's transient buffers (engine/zero_store.cpp), of the stage's largest unit U (a layer, wte's
    // rows, the head): stages 2 and 3 reduce-scatter every micro-batch's unit gradients from a fresh
    // buffer, at most two in flight beside the one filling (3 U gradients, and each in-flight one's
    // received partition); stage 3 also gathers the unit in use and prefetches the next (2 U weights).
    double unit = u.unit;
    if (f.embedding) unit = std::max(unit, Vp / t * C);
    if (f.head && (m.untie_embeddings_and_output_weights || p > 1)) unit = std::max(unit, Vp / t * C);
    const double zero_dp = d * cp;
    st.zero_buffer_bytes = 0;
    if (c.zero_stage >= 2 && zero_dp > 1) st.zero_buffer_bytes = 3 * unit * g + 2 * unit / zero_dp * g;
    if (c.zero_stage >= 3 && zero_dp > 1) st.zero_buffer_bytes += 2 * unit * a;
    // Each chunk has its own scratch and recompute buffer (an interleaved stage's v chunks: v of each).
    st.activation_bytes = micro_batch * st.micro_batches_in_flight + stash_ends + boundary + rebuilt * chunks +
                          st.zero_buffer_bytes + (f.head ? e.logits_bytes : 0) +
                          (f.gpt_layers > 0 ? e.attention_scratch_bytes + e.ring_workspace_bytes + layer_scratch * chunks
                                            : 0) +
                          (f.embedding ? embedding_scratch : 0) + (f.head ? head_scratch : 0);
    sum_states += st.model_state_bytes;
    sum_activations += st.activation_bytes;
    if (s < 1023 || s == stages - 1) e.stages.push_back(st);
  }
  if (world_size > 1) {
    // One rank per process, of a stage this process cannot tell: the largest.
    e.ranks_in_process = 1;
    e.model_state_bytes = e.largest_stage().model_state_bytes;
    e.activation_bytes = e.largest_stage().activation_bytes;
  } else {
    e.ranks_in_process = static_cast<int>(std::min(1e6, t * p * d * cp));
    e.model_state_bytes = sum_states * t * d * cp;
    e.activation_bytes = sum_activations * t * d * cp;
  }
  return e;
}

std::vector<std::string> memory_plan_lines(const TrainConfig& c, int world_size, double resident_now) {
  const GptConfig& m = c.model;
  const MemoryEstimate e = estimate_memory(c, world_size);
  const int dp = c.resolved_dp(std::max(1, world_size));
  std::vector<std::string> out;
  const int64_t tokens = int64_t{c.global_batch_size} * m.seq_length;
  out.push_back(fmt::format("model: {} family, {} parameters ({}); {:.4g} TFLOPs per iteration of {} tokens "
                            "(Megatron's count)",
                            m.family_name(), m.num_parameters(), count_text(static_cast<double>(m.num_parameters())),
                            m.flops_per_iteration(tokens) / 1e12, tokens));
  const PrecisionDType dt = c.precision.dtype;
  const std::string precision =
      dt == PrecisionDType::fp32
          ? std::string("fp32")
          : fmt::format("{} weights and activations, {} gradients, fp32 master weights and Adam moments", to_string(dt),
                        to_string(c.precision.grad_dtype(c.zero_stage)));
  out.push_back(fmt::format("memory plan per rank ({}; tp {}, pp {}, dp {}{}, ZeRO stage {}, recompute {}):", precision,
                            c.tensor_model_parallel_size, c.pipeline_model_parallel_size, dp,
                            c.ds_sequence_parallel_size > 1 ? fmt::format(", Ulysses {}", c.ds_sequence_parallel_size)
                            : c.context_parallel_size > 1   ? fmt::format(", cp {}", c.context_parallel_size)
                                                            : std::string(),
                            c.zero_stage, c.recompute_granularity));
  const size_t n = e.stages.size();
  for (size_t s = 0; s < n; ++s) {
    if (s >= 3 && s + 1 < n) continue;  // the first three stages and the last
    const StageMemory& st = e.stages[s];
    out.push_back(fmt::format(
        "  stage {}: {} parameters, {} of weights, gradients and Adam moments; {} of activations ({:g} "
        "micro-batch(es) in flight{})",
        s + 1 == n ? c.pipeline_model_parallel_size - 1 : static_cast<int>(s), count_text(st.parameters),
        size_text(st.model_state_bytes), size_text(st.activation_bytes), st.micro_batches_in_flight,
        (s + 1 == n ? ", logits " + size_text(e.logits_bytes) : std::string()) +
            (st.zero_buffer_bytes > 0 ? ", ZeRO's buffers " + size_text(st.zero_buffer_bytes) : std::string())));
  }
  out.push_back(fmt::format("  one micro-batch's activations on stage 0: {} without recompute, {} selective, {} full",
                            size_text(e.micro_batch_activation_none), size_text(e.micro_batch_activation_selective),
                            size_text(e.micro_batch_activation_full)));
  out.push_back(fmt::format("  this process: {} over {} rank(s)", size_text(e.total()), e.ranks_in_process));
  if (resident_now > 0)
    out.push_back(fmt::format("  expected peak of this process: {} (the plan and the {} it holds already: binary, "
                              "libraries, allocator)",
                              size_text(e.total() + resident_now), size_text(resident_now)));
  return out;
}

double resident_bytes_now() {
  long long pages = 0, resident = 0;
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return -1;
  const bool ok = std::fscanf(f, "%lld %lld", &pages, &resident) == 2;
  std::fclose(f);
  return ok && resident > 0 ? static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) : -1;
}

double available_memory_bytes() {
  double available = -1;
  if (std::FILE* f = std::fopen("/proc/meminfo", "r")) {
    char line[256];
    long long kib = 0;
    while (std::fgets(line, sizeof line, f) != nullptr)
      if (std::sscanf(line, "MemAvailable: %lld kB", &kib) == 1) {
        available = static_cast<double>(kib) * 1024;
        break;
      }
    std::fclose(f);
  }
  const double limit = read_number("/sys/fs/cgroup/memory.max");
  const double used = read_number("/sys/fs/cgroup/memory.current");
  if (limit > 0 && used >= 0) {
    const double left = std::max(0.0, limit - used);
    available = available < 0 ? left : std::min(available, left);
  }
  return available;
}

Status check_memory(const TrainConfig& c, int world_size, int local_ranks, double available,
                    const std::vector<StageFootprint>* model) {
  if (const char* off = std::getenv("TROUPE_MEMORY_CHECK"); off != nullptr && std::strcmp(off, "off") == 0)
    return Status::ok();
  if (!(available > 0)) return Status::ok();  // nothing to compare with
  const MemoryEstimate e = estimate_memory(c, world_size, model);
  const double share = available / std::max(1, local_ranks);
  if (e.total() <= share) return Status::ok();
  const bool activations = e.activation_bytes >= e.model_state_bytes;
  const std::string fix =
      activations ? "lower --micro-batch-size or --seq-length, or use --recompute-granularity full, more "
                    "--pipeline-model-parallel-size or --tensor-model-parallel-size"
                  : std::string(model != nullptr ? "declare fewer or smaller parameters in the model given in code"
                                                 : "lower --hidden-size or --num-layers") +
                        ", or spread the model states: --zero-stage 1-3 with more data-parallel ranks, more "
                        "--tensor-model-parallel-size / --pipeline-model-parallel-size, --offload-optimizer nvme";
  return Status::bad_input(fmt::format(
      "this configuration needs at least {:.3g} GiB per process ({:.3g} GiB of parameters, gradients and Adam "
      "moments, {:.3g} GiB of activations, over {} rank(s) in the process) but {:.3g} GiB are available{} -- {} "
      "(TROUPE_MEMORY_CHECK=off skips this check)",
      gib(e.total()), gib(e.model_state_bytes), gib(e.activation_bytes), e.ranks_in_process, gib(share),
      local_ranks > 1 ? fmt::format(" to each of the {} processes on this host", local_ranks) : std::string(), fix));
}

}  // namespace troupe
