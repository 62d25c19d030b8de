// The fuzz targets: one entry point per reader of outside bytes, run by libFuzzer in the fuzz build
// (fuzz/CMakeLists.txt, docs/FUZZING.md) and by the normal build's tests/fuzz test, which feeds it
// every file of fuzz/corpus/<name>/ and fuzz/regressions/<name>/.
//
// Contract of an entry point: it takes any bytes, returns the reader's Status (ok, or an error with
// a message), never crashes, leaks, hangs or allocates beyond what the input could hold; it aborts
// (TROUPE_CHECK) only when a property of an accepted input fails (e.g. a round trip), which is a
// bug the fuzzer reports. Entry points may write files, only under fuzz::scratch_dir().
//
// Adding a target: define troupe::fuzz::<name> in fuzz/targets/<name>.cpp, add X(<name>) below,
// call troupe_add_fuzzer(<name> <libraries>) in fuzz/CMakeLists.txt, and put seed inputs in
// fuzz/corpus/<name>/.
#pragma once
#include <cstddef>
#include <cstdint>

#include "troupe/status.hpp"

#define TROUPE_FUZZ_TARGETS(X) \
  X(train_config_json)         \
  X(deepspeed_json)            \
  X(indexed_dataset)           \
  X(gpt2_vocab)                \
  X(gpt2_merges)               \
  X(tokenize)                  \
  X(preprocess_input)          \
  X(train_flags)               \
  X(checkpoint_shard)          \
  X(checkpoint_shard_set)      \
  X(checkpoint_metadata)       \
  X(inspect_file)              \
  X(inspect_status)            \
  X(inspect_pieces)            \
  X(inspect_control)           \
  X(inspect_stages)            \
  X(dashboard_request)         \
  X(inspect_merge)             \
  X(data_blend)                \
  X(launch_flags)              \
  X(hf_safetensors)            \
  X(hf_index)                  \
  X(hf_config)                 \
  X(hf_tokenizer_json)         \
  X(sentencepiece_model)       \
  X(cluster_json)              \
  X(layout_text)               \
  X(prompts_jsonl)             \
  X(serve_request)             \
  X(snapshot_owner)            \
  X(snapshot_report)           \
  X(shard_coverage)            \
  X(elastic_rendezvous)        \
  X(rendezvous_hint)           \
  X(decode_work)

namespace troupe::fuzz {

#define TROUPE_FUZZ_DECLARE(name) Status name(const uint8_t* data, size_t size);
TROUPE_FUZZ_TARGETS(TROUPE_FUZZ_DECLARE)
#undef TROUPE_FUZZ_DECLARE

}  // namespace troupe::fuzz
