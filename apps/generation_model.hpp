// A checkpoint loaded whole for generation (troupe generate, troupe serve): its model as a Decoder and
// its tokenizer, both from the checkpoint's stored training config.
#pragma once
#include <memory>
#include <string>

#include "model/decoder.hpp"
#include "storage/tokenizer.hpp"
#include "troupe/status.hpp"

namespace troupe::apps {

struct GenerationModel {
  std::unique_ptr<Decoder> decoder;
  std::unique_ptr<Tokenizer> tokenizer;
  int64_t iteration = 0;
};

// iteration < 0: the latest. Bad input naming --load and the fix: not a checkpoint, a model generation
// does not run (MoE), a tokenizer whose vocabulary is not the model's.
Result<GenerationModel> load_generation_model(const std::string& dir, int64_t iteration);

}  // namespace troupe::apps
