// TensorBoard's event files, written without TensorFlow or a protobuf library (docs/COMPAT.md,
// "TensorBoard"). A file is a sequence of TFRecords, each
//   uint64 length | uint32 masked CRC-32C of those 8 bytes | data | uint32 masked CRC-32C of data
// (little-endian; masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8), whose data is one
// tensorflow.Event protobuf. The first event carries file_version "brain.Event:2"; each scalar is
//   Event{wall_time = 1 (double), step = 2 (int64),
//         summary = 5: Summary{value = 1: Value{tag = 1 (string), simple_value = 2 (float)}}}
// the form tf.summary's v1 scalars and PyTorch's SummaryWriter.add_scalar write, which
// TensorBoard's scalars dashboard reads.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "storage/durable.hpp"
#include "troupe/status.hpp"

namespace troupe {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78; crc32c("123456789") = 0xE3069283) and
// TFRecord's mask of it.
uint32_t crc32c(const void* data, size_t size);
uint32_t masked_crc32c(const void* data, size_t size);

// One record's bytes around `data`.
std::string tfrecord(std::string_view data);
// Event protobufs (their serialised bytes, not yet framed).
std::string file_version_event(double wall_time);
std::string scalar_event(double wall_time, int64_t step, std::string_view tag, float value);

// Appends scalar events to one event file in `dir`. Nothing touches the disk until the first
// flush(), which creates `dir` (and its parents) and the file
// events.out.tfevents.<unix seconds, 10 digits>.<hostname> (".1", ".2", ... appended while the name
// is taken: a resumed run in the same second starts a file of its own), beginning with the
// file_version event. TensorBoard merges every event file of a directory, so a resumed run that
// writes a new file beside the old continues the same curves.
//
// Failures: the first failed flush (a full disk, a folder that cannot be created) returns its
// Status; from then on the writer is off: add_scalar and flush do nothing and return no error, so
// the caller warns once and training goes on. Records are written whole per flush, in one append:
// a crash loses at most what was added since the last flush. Never throws; not thread-safe.
class EventFileWriter {
 public:
  explicit EventFileWriter(std::string dir);
  void add_scalar(std::string_view tag, double value, int64_t step);  // stamped with the time now
  Status flush();
  bool failed() const { return failed_; }
  // The file's path once created ("" before the first flush).
  std::string path() const { return file_ ? file_->path() : std::string(); }

 private:
  Status open_file();

  std::string dir_;
  std::string pending_;  // framed records not yet written
  std::optional<AppendOnlyFile> file_;
  std::optional<double> first_time_;  // wall time of the first add_scalar
  bool failed_ = false;
};

}  // namespace troupe
