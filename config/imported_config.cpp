#include "config/imported_config.hpp"

#include <filesystem>

#include "storage/durable.hpp"

#include <string>
#include <vector>

namespace troupe {

TrainConfig imported_train_config(const HfModel& m) {
  TrainConfig c;
  const HfGpt2Config& h = m.config;
  const HfArch& a = h.arch;
  GptConfig& g = c.model;
  g.num_layers = static_cast<int>(h.n_layer);
  g.hidden_size = static_cast<int>(h.n_embd);
  g.num_attention_heads = static_cast<int>(h.n_head);
  g.max_position_embeddings = static_cast<int>(h.n_positions);
  g.seq_length = static_cast<int>(h.seq_length > 0 ? h.seq_length : h.n_positions);
  g.vocab_size = h.vocab_size;
  g.layernorm_epsilon = h.layer_norm_epsilon;
  if (a.family == HfFamily::llama || a.family == HfFamily::mixtral) {
    g.normalization = Normalization::rmsnorm;
    g.position_embedding = PositionEmbedding::rope;
    g.activation = MlpActivation::swiglu;
    g.rotary_base = a.rope_theta;
    g.rotary_interleaved = a.rotary_interleaved;
    g.ffn_hidden = static_cast<int>(a.ffn);
    g.num_query_groups = a.groups == a.heads ? 0 : static_cast<int>(a.groups);
    g.kv_channels = a.head_dim * a.heads == a.hidden ? 0 : static_cast<int>(a.head_dim);
    g.add_bias_linear = a.bias;
    g.untie_embeddings_and_output_weights = !a.tied;
    if (a.family == HfFamily::mixtral) {
      // HF's router: softmax over every expert, the top k, renormalised to sum to 1 = Megatron-Core's
      // softmax over the top k logits (no pre-softmax), every token computed (dropless).
      MoeConfig& moe = g.moe;
      moe.num_experts = {static_cast<int>(a.experts)};
      moe.layer_freq = 1;
      moe.router = MoeRouter::megatron;
      moe.topk = static_cast<int>(a.topk);
      moe.drop_tokens = false;
      moe.pre_softmax = false;
      moe.aux_loss_coeff = a.aux_loss_coef;
      parse(a.load_balancing, moe.load_balancing);  // checked by the import
      moe.z_loss_coeff = a.z_loss_coeff;
      moe.input_jitter_eps = a.input_jitter_eps;
    }
  } else if (a.family == HfFamily::bloom) {
    g.position_embedding = PositionEmbedding::alibi;
    g.embed_layernorm = true;
    g.untie_embeddings_and_output_weights = !a.tied;
  }
  const bool gpt2 = a.family == HfFamily::gpt2;
  if (!m.vocab_file.empty())
    c.tokenizer_type = "GPT2BPETokenizer";
  else if (!h.tokenizer_type.empty())
    c.tokenizer_type = h.tokenizer_type;
  else if (gpt2)
    c.tokenizer_type = "GPT2BPETokenizer";
  if (c.tokenizer_type == "GPT2BPETokenizer") {
    c.vocab_file = m.vocab_file;
    c.merge_file = m.merge_file;
  }
  return c;
}

Result<std::string> take_hf_folder_tokenizer(TrainConfig& c) {
  namespace fs = std::filesystem;
  if (c.load.empty() || !is_hf_folder(c.load)) return std::string();
  if (c.tokenizer_type != "GPT2BPETokenizer" || !c.vocab_file.empty() || !c.merge_file.empty() ||
      !c.tokenizer_model.empty())
    return std::string();  // the run names its tokenizer
  const fs::path dir(c.load);
  std::error_code ec;
  auto has = [&](const char* name) { return fs::is_regular_file(dir / name, ec); };
  auto text = read_small_file((dir / "config.json").string(), kMaxHfJsonBytes);
  if (!text) return text.status().with_context("Hugging Face folder " + c.load + ": ").as_bad_input();
  auto hf = parse_hf_config(*text, (dir / "config.json").string() + ": ");
  if (!hf) return hf.status();
  const std::string& recorded = hf->tokenizer_type;
  const bool bpe = has("vocab.json") && has("merges.txt"), json = has("tokenizer.json"), sp = has("tokenizer.model");
  std::string type;
  if (recorded == "GPT2BPETokenizer" && bpe) type = recorded;
  else if (recorded == "HuggingFaceTokenizer" && json) type = recorded;
  else if ((recorded == "Llama2Tokenizer" || recorded == "GPTSentencePieceTokenizer") && sp) type = recorded;
  else if (bpe) type = "GPT2BPETokenizer";
  else if (json) type = "HuggingFaceTokenizer";
  else if (sp) type = "Llama2Tokenizer";
  else return std::string();
  c.tokenizer_type = type;
  std::string files;
  if (type == "GPT2BPETokenizer") {
    c.vocab_file = (dir / "vocab.json").string();
    c.merge_file = (dir / "merges.txt").string();
    files = "vocab.json and merges.txt";
  } else if (type == "HuggingFaceTokenizer") {
    c.tokenizer_model = c.load;
    files = "tokenizer.json";
  } else {
    c.tokenizer_model = (dir / "tokenizer.model").string();
    files = "tokenizer.model";
  }
  return "--load " + c.load + ": its tokenizer (" + files + ", --tokenizer-type " + type +
         "), as no tokenizer flags were given";
}

namespace {

// An MoE model: MixtralForCausalLM or nothing. `llama`: what LLaMA's attention, norms and head need
// that the model lacks. Mixtral's block (HF's MixtralSparseMoeBlock) is Megatron-Core's router
// without pre-softmax (softmax over all experts, the top k renormalised = softmax over the top k
// logits), dropless, on every layer, with the same number of bias-free SwiGLU experts everywhere.
Result<HfArch> mixtral_arch_of(const GptConfig& m, HfArch a, std::vector<std::string> need) {
  const MoeConfig& moe = m.moe;
  auto lacks = [&](bool ok, const char* what) {
    if (!ok) need.push_back(what);
  };
  lacks(!m.add_bias_linear, "no linear biases (--disable-bias-linear): Mixtral's linears and router have none");
  lacks(moe.router == MoeRouter::megatron,
        "Megatron-Core's router (Megatron-LM's --moe-* flags), not DeepSpeed's gating (--num-experts with --topk)");
  lacks(!moe.pre_softmax,
        "the top-k softmax (no --moe-router-pre-softmax): Mixtral renormalises the k chosen probabilities");
  lacks(!moe.drop_tokens, "dropless experts (no --moe-expert-capacity-factor): Mixtral computes every routed token");
  lacks(!moe.residual, "no PR-MoE residual MLP (--mlp-type standard)");
  lacks(moe.shared_expert_ffn == 0, "no shared expert (no --moe-shared-expert-intermediate-size)");
  int experts = 0;
  bool every_layer = true, same = true;
  for (int l = 0; l < m.num_layers; ++l) {
    const int e = moe.experts_of(l, m.num_layers);
    every_layer = every_layer && e > 0;
    if (e > 0 && experts > 0 && e != experts) same = false;
    if (experts == 0) experts = e;
  }
  lacks(every_layer, "an MoE block in every layer (--moe-layer-freq 1)");
  lacks(same, "the same number of experts in every layer (one --num-experts value)");
  if (!need.empty()) {
    std::string s;
    for (const std::string& x : need) s += "\n  " + x;
    return Status::bad_input("the model has experts, and MixtralForCausalLM, the one Hugging Face class troupe exports "
                             "them as, needs:" + s +
                             "\n(export the checkpoint as a troupe checkpoint, or train a model Mixtral can hold: "
                             "docs/MODELS.md, \"Mixtral\")");
  }
  a.family = HfFamily::mixtral;
  a.ffn = m.expert_ffn_hidden_size();
  a.experts = experts;
  a.topk = moe.topk;
  a.aux_loss_coef = moe.aux_loss_coeff;
  a.load_balancing = to_string(moe.load_balancing);
  a.z_loss_coeff = moe.z_loss_coeff;
  a.input_jitter_eps = moe.input_jitter_eps;
  return a;
}

}  // namespace

Result<HfArch> hf_arch_of(const GptConfig& m) {
  HfArch a;
  a.layers = m.num_layers;
  a.hidden = m.hidden_size;
  a.heads = m.num_attention_heads;
  a.groups = m.query_groups();
  a.head_dim = m.head_size();
  a.ffn = m.ffn_hidden_size();
  a.vocab = m.vocab_size;
  a.positions = m.max_position_embeddings;
  a.eps = m.layernorm_epsilon;
  a.rope_theta = m.rotary_base;
  a.bias = m.add_bias_linear;
  a.tied = !m.untie_embeddings_and_output_weights;
  a.rotary_interleaved = m.rotary_interleaved;
  const bool layernorm = m.normalization == Normalization::layernorm, gelu = m.activation == MlpActivation::gelu;
  const bool mha = a.groups == a.heads && a.head_dim * a.heads == a.hidden;
  // What each class needs that the model lacks.
  std::vector<std::string> gpt2, llama, bloom;
  auto need = [](std::vector<std::string>& v, bool ok, const char* what) {
    if (!ok) v.push_back(what);
  };
  need(gpt2, layernorm, "LayerNorm");
  need(gpt2, m.position_embedding == PositionEmbedding::learned_absolute, "learned absolute positions");
  need(gpt2, gelu && a.ffn == 4 * a.hidden, "a GELU MLP of 4h");
  need(gpt2, m.add_bias_linear, "linear biases");
  need(gpt2, !m.embed_layernorm, "no embedding LayerNorm");
  need(gpt2, mha, "multi-head attention with hidden / heads per head");
  need(llama, !layernorm, "RMSNorm");
  need(llama, m.position_embedding == PositionEmbedding::rope, "rope positions");
  need(llama, m.position_embedding != PositionEmbedding::rope || m.rotary_dim() == m.head_size(),
       "rope over the whole (even) head (--rotary-percent 1)");
  need(llama, !gelu, "a SwiGLU MLP");
  need(llama, !m.embed_layernorm, "no embedding LayerNorm");
  need(bloom, layernorm, "LayerNorm");
  need(bloom, m.position_embedding == PositionEmbedding::alibi, "ALiBi positions");
  need(bloom, gelu && a.ffn == 4 * a.hidden, "a GELU MLP of 4h");
  need(bloom, m.add_bias_linear, "linear biases");
  need(bloom, m.embed_layernorm, "the embedding LayerNorm");
  need(bloom, mha, "multi-head attention with hidden / heads per head");
  if (m.moe.enabled()) return mixtral_arch_of(m, a, llama);
  if (gpt2.empty()) return a;
  if (llama.empty()) {
    a.family = HfFamily::llama;
    return a;
  }
  if (bloom.empty()) {
    a.family = HfFamily::bloom;
    return a;
  }
  auto list = [](const std::vector<std::string>& v) {
    std::string s;
    for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
    return s;
  };
  return Status::bad_input("the model is none of the Hugging Face classes troupe exports:\n  GPT2LMHeadModel needs " +
                           list(gpt2) + "\n  LlamaForCausalLM needs " + list(llama) + "\n  BloomForCausalLM needs " +
                           list(bloom) + "\n(export the checkpoint as a troupe checkpoint, or train a model of one of "
                           "these families: docs/MODELS.md)");
}

}  // namespace troupe
