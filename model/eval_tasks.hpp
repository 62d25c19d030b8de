// Megatron's zero-shot evaluation tasks that need no download (tasks/zeroshot_gpt), over a Decoder
// (docs/SERVE.md, "troupe eval --task"):
//   perplexity   one token stream cut into windows of `window` tokens that start `stride` apart
//                (Megatron's --overlapping-eval): every window predicts its tokens from the ones
//                before it in the window, and only its last `stride` predictions count (all of the
//                first window's), so each token is predicted once, with up to window - stride
//                tokens of context before the window's scored part. The sum of the losses over the
//                scored tokens; the caller normalises it per token, per byte or per word.
//   last word    LAMBADA-style: a context and its last word's tokens; correct when greedy decoding
//                given the context (teacher-forced) predicts every token of the word.
#pragma once
#include <cstdint>
#include <vector>

#include "model/decoder.hpp"

namespace troupe {

struct WindowedLoss {
  double loss_sum = 0;  // nats over the scored tokens
  int64_t scored = 0;   // tokens predicted (the stream's length - 1)
  int64_t windows = 0;
};
// tokens: at least 2; window in [2, max positions]; stride in [1, window - 1] (the windows overlap by
// window - stride), or stride == window for disjoint windows.
Result<WindowedLoss> windowed_loss(Context& ctx, SequenceDecoder& decoder, const std::vector<int32_t>& tokens, int window,
                                   int stride);

struct LastWordExample {
  std::vector<int32_t> context, target;  // both non-empty
};
struct LastWordResult {
  int64_t correct = 0, total = 0;
  std::vector<bool> each;
};
Result<LastWordResult> last_word_accuracy(Context& ctx, SequenceDecoder& decoder, const std::vector<LastWordExample>& examples);

}  // namespace troupe
