// GptConfig's mixture-of-experts arithmetic and checks (include/troupe/model_config.hpp states the
// rules): the parameters and per-token FLOPs of one MoE layer's MLP, and MoeConfig's problems.
// Internal to model/config.cpp; pure functions.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "troupe/model_config.hpp"

namespace troupe {

// Parameters of an MoE layer of `experts` experts in place of the dense MLP: the router, the
// experts, the residual MLP and its coefficient, the shared expert.
int64_t moe_mlp_parameters(const GptConfig& m, int experts);

// What one token computes in that MLP, in multiply-adds (the caller multiplies by 2 x 3): k
// experts, the router, the residual MLP and coefficient, the shared expert.
double moe_mlp_macs_per_token(const GptConfig& m, int experts);

// MoeConfig's problems ("FLAG what -- fix"), appended to `out`; nothing without experts.
void append_moe_problems(const GptConfig& m, std::vector<std::string>& out);

}  // namespace troupe
