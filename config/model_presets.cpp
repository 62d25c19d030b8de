#include "config/model_presets.hpp"

namespace troupe {
namespace {

GptConfig gpt2(int layers, int hidden, int heads) {
  GptConfig m;  // GPT-2's family is GptConfig's default
  m.num_layers = layers;
  m.hidden_size = hidden;
  m.num_attention_heads = heads;
  m.seq_length = m.max_position_embeddings = 1024;  // n_positions
  m.vocab_size = 50257;
  m.layernorm_epsilon = 1e-5;
  m.hidden_dropout = m.attention_dropout = 0.1;  // resid_pdrop, attn_pdrop
  return m;
}

// LLaMA: RMSNorm, rotary (rotate-half pairs, as Hugging Face's weights), SwiGLU, no biases, untied head.
GptConfig llama(int layers, int hidden, int heads, int kv_heads, int ffn, int positions, int64_t vocab, double theta) {
  GptConfig m;
  m.num_layers = layers;
  m.hidden_size = hidden;
  m.num_attention_heads = heads;
  m.num_query_groups = kv_heads == heads ? 0 : kv_heads;
  m.ffn_hidden = ffn;
  m.seq_length = m.max_position_embeddings = positions;
  m.vocab_size = vocab;
  m.set_llama_family();
  m.layernorm_epsilon = 1e-5;  // rms_norm_eps
  m.rotary_base = theta;       // rope_theta
  m.hidden_dropout = m.attention_dropout = 0;
  return m;
}

// Mixtral: LLaMA's family with a sparse MoE block in every layer (HF's MixtralSparseMoeBlock:
// Megatron-Core's router without pre-softmax, dropless); the expert width is the MLP width, as
// Megatron-LM's Mixtral scripts give it (--ffn-hidden-size). Trained at `seq` tokens, positions up to
// `positions`.
GptConfig mixtral(int layers, int hidden, int heads, int kv_heads, int ffn, int experts, int topk, int positions,
                  int seq, int64_t vocab, double theta) {
  GptConfig m = llama(layers, hidden, heads, kv_heads, ffn, positions, vocab, theta);
  m.seq_length = seq;
  m.moe.num_experts = {experts};
  m.moe.router = MoeRouter::megatron;
  m.moe.topk = topk;
  m.moe.drop_tokens = false;
  m.moe.aux_loss_coeff = 0.02;  // router_aux_loss_coef of the published config
  return m;
}

// BLOOM: ALiBi, a LayerNorm on the embeddings, GELU MLP of 4h with biases, tied head.
GptConfig bloom(int layers, int hidden, int heads) {
  GptConfig m;
  m.num_layers = layers;
  m.hidden_size = hidden;
  m.num_attention_heads = heads;
  m.seq_length = m.max_position_embeddings = 2048;  // the training sequence (ALiBi has no table)
  m.vocab_size = 250880;
  m.set_bloom_family();
  m.layernorm_epsilon = 1e-5;
  m.hidden_dropout = m.attention_dropout = 0;
  return m;
}

}  // namespace

const std::vector<ModelPreset>& model_presets() {
  static const std::vector<ModelPreset> presets = {
      {"gpt2-124m", "openai-community/gpt2", gpt2(12, 768, 12), 124'439'808},
      {"gpt2-350m", "openai-community/gpt2-medium", gpt2(24, 1024, 16), 354'823'168},
      {"gpt2-774m", "openai-community/gpt2-large", gpt2(36, 1280, 20), 774'030'080},
      {"gpt2-1.5b", "openai-community/gpt2-xl", gpt2(48, 1600, 25), 1'557'611'200},
      {"llama2-7b", "meta-llama/Llama-2-7b-hf", llama(32, 4096, 32, 32, 11008, 4096, 32000, 10000), 6'738'415'616},
      {"llama2-13b", "meta-llama/Llama-2-13b-hf", llama(40, 5120, 40, 40, 13824, 4096, 32000, 10000), 13'015'864'320},
      {"llama2-70b", "meta-llama/Llama-2-70b-hf", llama(80, 8192, 64, 8, 28672, 4096, 32000, 10000), 68'976'648'192},
      {"llama3-8b", "meta-llama/Meta-Llama-3-8B", llama(32, 4096, 32, 8, 14336, 8192, 128256, 500000), 8'030'261'248},
      {"mixtral-8x7b", "mistralai/Mixtral-8x7B-v0.1",
       mixtral(32, 4096, 32, 8, 14336, 8, 2, 32768, 4096, 32000, 1e6), 46'702'792'704},
      {"bloom-560m", "bigscience/bloom-560m", bloom(24, 1024, 16), 559'214'592},
      {"bloom-176b", "bigscience/bloom", bloom(70, 14336, 112), 176'247'271'424},
  };
  return presets;
}

const ModelPreset* find_model_preset(const std::string& name) {
  for (const ModelPreset& p : model_presets())
    if (p.name == name) return &p;
  return nullptr;
}

std::string model_preset_names() {
  std::string out;
  for (const ModelPreset& p : model_presets()) out += (out.empty() ? "" : ", ") + p.name;
  return out;
}

void apply_model_preset(const ModelPreset& preset, GptConfig* m, const FlagGivenFn& given) {
  const GptConfig& p = preset.model;
  auto any = [&](std::initializer_list<const char*> flags) {
    for (const char* f : flags)
      if (given(f)) return true;
    return false;
  };
  auto take = [&](std::initializer_list<const char*> flags, auto& field, const auto& value) {
    if (!any(flags)) field = value;
  };
  take({"--num-layers"}, m->num_layers, p.num_layers);
  take({"--hidden-size"}, m->hidden_size, p.hidden_size);
  take({"--num-attention-heads"}, m->num_attention_heads, p.num_attention_heads);
  take({"--seq-length"}, m->seq_length, p.seq_length);
  take({"--max-position-embeddings"}, m->max_position_embeddings, p.max_position_embeddings);
  take({"--ffn-hidden-size"}, m->ffn_hidden, p.ffn_hidden);
  take({"--num-query-groups", "--num-key-value-heads", "--group-query-attention"}, m->num_query_groups,
       p.num_query_groups);
  take({"--kv-channels"}, m->kv_channels, p.kv_channels);
  take({"--normalization"}, m->normalization, p.normalization);
  take({"--position-embedding-type", "--use-rotary-position-embeddings"},
       m->position_embedding, p.position_embedding);
  take({"--rotary-percent"}, m->rotary_percent, p.rotary_percent);
  take({"--rotary-base"}, m->rotary_base, p.rotary_base);
  take({"--rotary-interleaved"}, m->rotary_interleaved, p.rotary_interleaved);
  take({"--swiglu"}, m->activation, p.activation);
  take({"--disable-bias-linear", "--add-bias-linear"}, m->add_bias_linear, p.add_bias_linear);
  take({"--untie-embeddings-and-output-weights"}, m->untie_embeddings_and_output_weights,
       p.untie_embeddings_and_output_weights);
  take({"--embed-layernorm"}, m->embed_layernorm, p.embed_layernorm);
  take({"--norm-epsilon"}, m->layernorm_epsilon, p.layernorm_epsilon);
  take({"--init-method-std"}, m->init_method_std, p.init_method_std);
  take({"--hidden-dropout"}, m->hidden_dropout, p.hidden_dropout);
  take({"--attention-dropout"}, m->attention_dropout, p.attention_dropout);
  // The experts go whole: with any mixture-of-experts flag the command line describes them itself.
  take({"--num-experts", "--moe-router-topk", "--topk", "--moe-ffn-hidden-size", "--moe-layer-freq",
        "--expert-interval", "--moe-aux-loss-coeff", "--moe-loss-coeff", "--moe-router-load-balancing-type",
        "--moe-expert-capacity-factor", "--moe-train-capacity-factor", "--moe-router-pre-softmax",
        "--moe-shared-expert-intermediate-size", "--mlp-type", "--disable-moe-token-dropping"},
       m->moe, p.moe);
}

}  // namespace troupe
