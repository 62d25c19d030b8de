#include "storage/tfevents.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <exception>

namespace troupe {
namespace {

std::array<uint32_t, 256> crc32c_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}

// ---- protobuf wire format (the few pieces an Event needs)

enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_key(std::string& out, uint32_t field, WireType type) { put_varint(out, (uint64_t{field} << 3) | type); }

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

void put_bytes(std::string& out, uint32_t field, std::string_view bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out.append(bytes);
}

void put_double(std::string& out, uint32_t field, double v) {
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, field, kFixed64);
  put_le(out, bits, 8);
}

void put_float(std::string& out, uint32_t field, float v) {
  uint32_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, field, kFixed32);
  put_le(out, bits, 4);
}

// Event's fields (tensorflow/core/util/event.proto) and Summary's (summary.proto).
constexpr uint32_t kEventWallTime = 1, kEventStep = 2, kEventFileVersion = 3, kEventSummary = 5;
constexpr uint32_t kSummaryValue = 1;
constexpr uint32_t kValueTag = 1, kValueSimpleValue = 2;

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

}  // namespace

uint32_t crc32c(const void* data, size_t size) {
  static const std::array<uint32_t, 256> table = crc32c_table();
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < size; ++i) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t c = crc32c(data, size);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string tfrecord(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  put_le(out, data.size(), 8);
  put_le(out, masked_crc32c(out.data(), 8), 4);
  out.append(data);
  put_le(out, masked_crc32c(data.data(), data.size()), 4);
  return out;
}

std::string file_version_event(double wall_time) {
  std::string e;
  put_double(e, kEventWallTime, wall_time);
  put_bytes(e, kEventFileVersion, "brain.Event:2");
  return e;
}

std::string scalar_event(double wall_time, int64_t step, std::string_view tag, float value) {
  std::string v;
  put_bytes(v, kValueTag, tag);
  put_float(v, kValueSimpleValue, value);
  std::string summary;
  put_bytes(summary, kSummaryValue, v);
  std::string e;
  put_double(e, kEventWallTime, wall_time);
  put_key(e, kEventStep, kVarint);
  put_varint(e, static_cast<uint64_t>(step));  // int64: two's complement, as protobuf encodes it
  put_bytes(e, kEventSummary, summary);
  return e;
}

EventFileWriter::EventFileWriter(std::string dir) : dir_(std::move(dir)) {}

void EventFileWriter::add_scalar(std::string_view tag, double value, int64_t step) {
  if (failed_) return;
  try {
    const double now = now_seconds();
    if (!first_time_) first_time_ = now;
    pending_ += tfrecord(scalar_event(now, step, tag, static_cast<float>(value)));
  } catch (const std::exception&) {  // out of memory: drop the record rather than the run
    failed_ = true;
  }
}

Status EventFileWriter::open_file() {
  TROUPE_RETURN_IF_ERROR(make_directories(dir_));
  // The file's time (its name, the file_version event) is that of its first record, so that no
  // event in it is older than the file.
  const double now = first_time_.value_or(now_seconds());
  const std::string base =
      fmt::format("{}/events.out.tfevents.{:010d}.{}", dir_, static_cast<int64_t>(now), host_name());
  for (int n = 0;; ++n) {
    bool taken = false;
    auto f = AppendOnlyFile::create(n == 0 ? base : fmt::format("{}.{}", base, n), &taken);
    if (f) {
      file_.emplace(std::move(f).value());
      break;
    }
    if (!taken || n >= 1000) return f.status();
  }
  pending_.insert(0, tfrecord(file_version_event(now)));
  return Status::ok();
}

Status EventFileWriter::flush() {
  if (failed_ || (pending_.empty() && file_)) return Status::ok();
  try {
    Status st = file_ ? Status::ok() : open_file();
    if (st) st = file_->append(pending_.data(), pending_.size());
    pending_.clear();
    if (!st) failed_ = true;
    return st;
  } catch (const std::exception& e) {
    failed_ = true;
    pending_.clear();
    return Status::error(std::string("TensorBoard event file: ") + e.what());
  }
}

}  // namespace troupe
