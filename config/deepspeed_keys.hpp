// The DeepSpeed JSON keys troupe accepts without acting on them, each with the reason it changes
// nothing in troupe (config/deepspeed_config.cpp reports one start-up note per key found), and the
// blocks that are harmless only while switched off ("enabled": false). What troupe does with the
// keys it implements is documented in deepspeed_config.cpp; docs/COMPAT.md prints these tables.
#pragma once
#include <string>
#include <vector>

namespace troupe {

// What a harmless key's value must look like (DeepSpeed's own type for it).
enum class DsValue {
  boolean,        // true or false
  count,          // a whole number >= 0, as an integer or e.g. 5e8
  number,         // any number
  string,         // any string
  object,         // a block whose contents only tune DeepSpeed
  false_only,     // false: harmless; true changes the numbers (refused with `why_refused`)
  minus_one_only  // -1 (DeepSpeed's "off"): harmless; another value is refused with `why_refused`
};

struct DsHarmlessKey {
  std::string block;  // "" (top level), "zero_optimization", "fp16", ...
  std::string key;
  DsValue value;
  std::string why;          // the note: why it changes nothing in troupe
  std::string why_refused;  // false_only / minus_one_only: why the other value cannot be honoured
};

// A block that is harmless while its top-level "enabled" is false (or absent); enabled, troupe
// refuses it with `why_refused`. Its other keys are not checked (they configure what is off).
// "compression_training" and "data_efficiency" switch otherwise (config/deepspeed_config.cpp).
struct DsSwitchedBlock {
  std::string key;
  std::string why_refused;
};

const std::vector<DsHarmlessKey>& deepspeed_harmless_keys();
const std::vector<DsSwitchedBlock>& deepspeed_switched_blocks();

}  // namespace troupe
