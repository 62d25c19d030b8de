// What the memory estimate needs to know of one virtual stage of a model given in code
// (include/troupe/stage.hpp), as check_model reads it from the blocks' declarations
// (config/memory_estimate.hpp uses it instead of GPT's even split of the layers).
#pragma once
#include <cstdint>

namespace troupe {

struct StageFootprint {
  int gpt_layers = 0;                  // GPT layers on this virtual stage
  bool embedding = false, head = false;  // GPT's token embedding, GPT's head
  double custom_parameters = 0;        // the custom blocks' parameters on one tensor-parallel rank
  // f32/i32 elements per micro-batch of the custom blocks' boundary tensors (inputs and outputs):
  // what a custom block is known to keep per micro-batch in flight.
  double custom_boundary_elements = 0;
};

}  // namespace troupe
