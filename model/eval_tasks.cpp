// model/eval_tasks.hpp.
#include "model/eval_tasks.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "model/generation.hpp"

namespace troupe {

Result<WindowedLoss> windowed_loss(Context& ctx, SequenceDecoder& decoder, const std::vector<int32_t>& tokens, int window,
                                   int stride) {
  const int64_t positions = decoder.config().max_position_embeddings;
  if (tokens.size() < 2) return Status::bad_input("the text is under 2 tokens -- give a longer text");
  if (window < 2 || window > positions)
    return Status::bad_input(fmt::format("a window of {} tokens -- give 2 to the model's {} positions", window, positions));
  if (stride < 1 || stride > window)
    return Status::bad_input(fmt::format("--overlapping-eval {} -- give 1 to the window's {} tokens", stride, window));
  const size_t V = static_cast<size_t>(decoder.config().vocab_size);
  const int64_t n = static_cast<int64_t>(tokens.size());
  WindowedLoss out;
  // Window k covers inputs [start, start + window) and predicts tokens start + 1 .. start + window;
  // the first scores all of them, the others their last `stride`.
  for (int64_t start = 0, next_scored = 1; next_scored < n; ++out.windows) {
    const int64_t end = std::min<int64_t>(start + window, n - 1);  // inputs [start, end)
    const int id = decoder.open_sequence();
    auto logits = decoder.feed(ctx, {id}, {std::vector<int32_t>(tokens.begin() + start, tokens.begin() + end)}, true);
    decoder.close_sequence(id);
    if (!logits) return logits.status();
    const std::vector<float>& all = logits.value()[0];
    for (int64_t t = std::max(next_scored, start + 1); t <= end; ++t) {  // predict token t from row t - 1
      const size_t row = static_cast<size_t>(t - 1 - start);
      const std::vector<float> r(all.begin() + static_cast<std::ptrdiff_t>(row * V),
                                 all.begin() + static_cast<std::ptrdiff_t>((row + 1) * V));
      out.loss_sum -= token_log_prob(r, tokens[static_cast<size_t>(t)]);
      ++out.scored;
    }
    next_scored = end + 1;
    if (next_scored >= n) break;
    start = std::max<int64_t>(0, end + stride - window);  // the next window's scored part starts at `end`
  }
  return out;
}

Result<LastWordResult> last_word_accuracy(Context& ctx, SequenceDecoder& decoder, const std::vector<LastWordExample>& examples) {
  const int64_t positions = decoder.config().max_position_embeddings;
  const size_t V = static_cast<size_t>(decoder.config().vocab_size);
  LastWordResult out;
  for (size_t i = 0; i < examples.size(); ++i) {
    const LastWordExample& e = examples[i];
    if (e.context.empty() || e.target.empty())
      return Status::bad_input(fmt::format("text {} has no context or no last word -- give texts of two words or more", i + 1));
    std::vector<int32_t> seq = e.context;
    seq.insert(seq.end(), e.target.begin(), e.target.end() - 1);
    if (static_cast<int64_t>(seq.size()) > positions) {
      // Keep the end: the last word and the context right before it.
      seq.erase(seq.begin(), seq.begin() + static_cast<std::ptrdiff_t>(static_cast<int64_t>(seq.size()) - positions));
    }
    const int id = decoder.open_sequence();
    auto logits = decoder.feed(ctx, {id}, {seq}, true);
    decoder.close_sequence(id);
    if (!logits) return logits.status();
    const std::vector<float>& all = logits.value()[0];
    const size_t first = seq.size() - e.target.size();  // the row predicting the word's first token
    bool ok = true;
    for (size_t j = 0; j < e.target.size() && ok; ++j) {
      const auto row = all.begin() + static_cast<std::ptrdiff_t>((first + j) * V);
      const int32_t best = static_cast<int32_t>(std::max_element(row, row + static_cast<std::ptrdiff_t>(V)) - row);
      ok = best == e.target[j];
    }
    out.each.push_back(ok);
    out.correct += ok ? 1 : 0;
    ++out.total;
  }
  return out;
}

}  // namespace troupe
