// Helpers shared by the fuzz targets (fuzz/fuzz_targets.hpp).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

namespace troupe {
class Tokenizer;
}  // namespace troupe

namespace troupe::fuzz {

// A directory private to this process for the files the targets hand to readers: created on first
// use under /dev/shm (memory; falls back to $TMPDIR or /tmp), removed when the process exits.
const std::string& scratch_dir();

// Writes `bytes` to scratch_dir()/name (replacing it) and returns the path.
std::string write_scratch(const std::string& name, std::string_view bytes);

// An input made of two files: the first 4 bytes (little-endian) give the length of the first part,
// clamped to what is there; the rest is the second part. Inputs shorter than 4 bytes are one empty
// and one short part.
std::pair<std::string_view, std::string_view> split_two(const uint8_t* data, size_t size);

// The inverse of split_two, for writing seeds.
std::string join_two(std::string_view first, std::string_view second);

// Aborts unless every id of tok.encode(text) lies in the vocabulary and decode gives text back.
void check_round_trip(const Tokenizer& tok, std::string_view text);

// A file of the source tree (fuzz/data/...), by its path relative to the root.
std::string source_path(const std::string& relative);

}  // namespace troupe::fuzz
