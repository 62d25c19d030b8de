// The reference's own dropout, written apart from the product's (kernels/dropout.hpp,
// kernels/cpu/attention.cpp) from the same written rule (model/dropout.hpp): a second Philox-4x32-10
// transcription, the mask as a real-valued comparison u >= p, and a plain causal attention with
// dropout on the probabilities, summed in double. Slow and obviously correct; tests only.
#pragma once
#include <cstdint>

#include "model/dropout.hpp"
#include "troupe/model_config.hpp"

namespace troupe::ref_dropout {

// Philox-4x32-10 of counter (c[0..3]) and key (k0, k1); c receives the output.
void philox(uint32_t c[4], uint32_t k0, uint32_t k1);

// The factor (0 or 1 / (1 - p)) element `element` of global sample `sample` of `site` of layer
// `layer` gets; 1 when the model's probability for the site is 0.
double dropout_factor(const GptConfig& model, const MicroBatchKey& key, DropoutSite site, int layer, int64_t sample,
                      int64_t element);

// Causal self-attention with attention dropout, one sample batch of B sequences, all H heads (grouped-query
// attention over G groups of head size hs, ALiBi slopes with alibi positions; qkv (B,T,(H+2G)hs)):
// probs (B,H,T,T) receives the softmax before dropout; out (B,T,H hs) = dropout(probs) v.
template <class T>
void attention_forward(const GptConfig& model, const MicroBatchKey& key, int layer, T* out, T* probs, const T* qkv,
                       int64_t B);
// dqkv (B,T,(H+2G)hs) from dout (B,T,H hs), the forward's qkv and probs (the masks are regenerated).
template <class T>
void attention_backward(const GptConfig& model, const MicroBatchKey& key, int layer, T* dqkv, const T* dout,
                        const T* qkv, const T* probs, int64_t B);

}  // namespace troupe::ref_dropout
