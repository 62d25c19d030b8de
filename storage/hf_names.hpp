// GPT2LMHeadModel's parameters under their Hugging Face names, shared by the export
// (storage/hf_export.hpp) and the import (storage/hf_import.hpp). troupe's checkpoints use the same
// names (model/params.hpp); what differs is the orientation of the four Conv1D weights per layer:
// troupe stores linear weights (out, in) as torch.nn.Linear does, HF's Conv1D stores them (in, out).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/tensor.hpp"

namespace troupe {

struct HfTensor {
  std::string name;    // the HF key, which is also troupe's name of the parameter
  Shape troupe_shape;  // (out, in) for Conv1D weights
  Shape hf_shape;      // (in, out) for Conv1D weights; otherwise troupe_shape
};

// The state-dict keys of GPT2LMHeadModel in its order, without lm_head.weight (tied to wte).
std::vector<HfTensor> gpt2_hf_tensors(int64_t layers, int64_t vocab, int64_t positions, int64_t hidden);

// .attn.c_attn.weight, .attn.c_proj.weight, .mlp.c_fc.weight, .mlp.c_proj.weight.
bool is_conv1d_weight(const std::string& name);

// (rows, cols) row-major -> (cols, rows), in cache-sized tiles.
void transpose(const float* src, int64_t rows, int64_t cols, float* dst);

}  // namespace troupe
