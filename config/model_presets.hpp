// --model-preset NAME: the architectures of published models (GPT-2, LLaMA-2, LLaMA-3, Mixtral, BLOOM) as
// GptConfig values, taken from their published configurations (the Hugging Face config.json of each
// model: sizes, heads, key/value heads, MLP width, positions, norm epsilon, rotary base, tied or
// untied head, vocabulary). docs/MODELS.md lists them with their parameter counts.
//
// A preset fills the model's fields for the flags not given on the command line: explicit flags win
// (apply_model_preset). The vocabulary stays the tokenizer's (the preset's vocab_size is the
// published tokenizer's, for the counts and the plan). Pure data; thread-safe.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "config/deepspeed_config.hpp"  // FlagGivenFn
#include "troupe/model_config.hpp"

namespace troupe {

struct ModelPreset {
  std::string name;          // "llama2-7b"
  std::string source;        // the published configuration it follows
  GptConfig model;           // vocab_size: the published tokenizer's
  int64_t published_parameters = 0;  // the count its authors (or Hugging Face) give
};

// Every preset, in the order docs/MODELS.md lists them.
const std::vector<ModelPreset>& model_presets();
// nullptr when there is no preset of that name.
const ModelPreset* find_model_preset(const std::string& name);
// "gpt2-124m, gpt2-350m, ...": for messages.
std::string model_preset_names();

// Copies the preset's architecture into `*m` for every field whose flag `given` says was not on the
// command line (--num-layers, --hidden-size, --num-attention-heads, --seq-length,
// --max-position-embeddings, --ffn-hidden-size, --num-query-groups / --num-key-value-heads /
// --group-query-attention, --kv-channels, --normalization, --position-embedding-type and its aliases,
// --rotary-*, --swiglu, --disable-bias-linear / --add-bias-linear, --untie-embeddings-and-output-weights,
// --embed-layernorm, --norm-epsilon, --init-method-std, the dropouts; the mixture of experts as a
// whole, unless a mixture-of-experts flag is given). The vocabulary is left alone.
void apply_model_preset(const ModelPreset& preset, GptConfig* m, const FlagGivenFn& given);

}  // namespace troupe
