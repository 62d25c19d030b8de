// storage/tfevents.hpp against a decoder written here from the format's description: TFRecord
// framing with CRC-32C computed bit by bit (not the writer's table), and the protobuf wire format
// read generically (any field order, unknown fields skipped), so the test checks the bytes, not
// the writer's own encoding choices.
#include "storage/tfevents.hpp"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "storage/durable.hpp"
#include "tests/test_util.hpp"

namespace troupe {
namespace {

namespace fs = std::filesystem;

// ---- the reference decoder

uint32_t crc32c_bitwise(const std::string& bytes) {
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char b : bytes) {
    crc ^= b;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

uint32_t mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

uint64_t read_le(const std::string& s, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{static_cast<unsigned char>(s[at + i])} << (8 * i);
  return v;
}

// The records of a file's bytes; `error` says where the framing or a CRC is wrong.
std::vector<std::string> read_records(const std::string& file, std::string* error) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < file.size()) {
    if (file.size() - at < 12) {
      *error = "truncated header at " + std::to_string(at);
      return out;
    }
    const uint64_t length = read_le(file, at, 8);
    if (read_le(file, at + 8, 4) != mask(crc32c_bitwise(file.substr(at, 8)))) {
      *error = "length CRC mismatch at " + std::to_string(at);
      return out;
    }
    if (file.size() - at - 12 < length + 4) {
      *error = "truncated record at " + std::to_string(at);
      return out;
    }
    const std::string data = file.substr(at + 12, length);
    if (read_le(file, at + 12 + length, 4) != mask(crc32c_bitwise(data))) {
      *error = "data CRC mismatch at " + std::to_string(at);
      return out;
    }
    out.push_back(data);
    at += 16 + length;
  }
  return out;
}

struct Field {
  int wire = 0;
  uint64_t number = 0;  // varint, fixed64, fixed32
  std::string bytes;    // length-delimited
};

// Fields by number (the last occurrence, as protobuf merges scalars), of one message.
std::map<uint32_t, Field> parse_message(const std::string& m) {
  std::map<uint32_t, Field> fields;
  size_t at = 0;
  auto varint = [&]() {
    uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      REQUIRE(at < m.size());
      REQUIRE(shift < 64);
      const auto b = static_cast<unsigned char>(m[at++]);
      v |= uint64_t{b & 0x7Fu} << shift;
      if ((b & 0x80) == 0) return v;
    }
  };
  while (at < m.size()) {
    const uint64_t key = varint();
    Field f;
    f.wire = static_cast<int>(key & 7);
    switch (f.wire) {
      case 0: f.number = varint(); break;
      case 1: REQUIRE(m.size() - at >= 8); f.number = read_le(m, at, 8); at += 8; break;
      case 5: REQUIRE(m.size() - at >= 4); f.number = read_le(m, at, 4); at += 4; break;
      case 2: {
        const uint64_t n = varint();
        REQUIRE(m.size() - at >= n);
        f.bytes = m.substr(at, n);
        at += n;
        break;
      }
      default: FAIL("wire type " << f.wire);
    }
    fields[static_cast<uint32_t>(key >> 3)] = f;
  }
  return fields;
}

struct Decoded {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version, tag;
  float value = 0;
  bool scalar = false;
};

Decoded decode_event(const std::string& data) {
  auto e = parse_message(data);
  Decoded d;
  REQUIRE(e.count(1));
  REQUIRE(e[1].wire == 1);
  std::memcpy(&d.wall_time, &e[1].number, 8);
  if (e.count(2)) {
    REQUIRE(e[2].wire == 0);
    d.step = static_cast<int64_t>(e[2].number);
  }
  if (e.count(3)) d.file_version = e[3].bytes;
  if (e.count(5)) {
    auto summary = parse_message(e[5].bytes);
    REQUIRE(summary.count(1));
    auto value = parse_message(summary[1].bytes);
    REQUIRE(value.count(1));
    REQUIRE(value.count(2));
    REQUIRE(value[2].wire == 5);
    d.tag = value[1].bytes;
    const auto bits = static_cast<uint32_t>(value[2].number);
    std::memcpy(&d.value, &bits, 4);
    d.scalar = true;
  }
  return d;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<fs::path> event_files(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

double now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

struct Scalar {
  std::string tag;
  double value;
  int64_t step;
};

}  // namespace

TEST_CASE("crc32c matches a bitwise CRC-32C on the check value and random bytes", "[tfevents]") {
  const std::string check = "123456789";
  CHECK(crc32c_bitwise(check) == 0xE3069283u);  // the published check value of CRC-32C
  CHECK(crc32c(check.data(), check.size()) == 0xE3069283u);
  std::mt19937 rng(7);
  for (int len : {0, 1, 7, 8, 63, 1000}) {
    std::string s(static_cast<size_t>(len), '\0');
    for (char& c : s) c = static_cast<char>(rng());
    CHECK(crc32c(s.data(), s.size()) == crc32c_bitwise(s));
    CHECK(masked_crc32c(s.data(), s.size()) == mask(crc32c_bitwise(s)));
  }
}

TEST_CASE("an event file decodes to file_version then every scalar, in order", "[tfevents]") {
  test::TempDir tmp;
  const std::string dir = tmp.str("runs/a");  // parents created by the first flush
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> value(-1e3, 1e3);
  std::vector<Scalar> written;
  const double t0 = now();
  EventFileWriter w(dir);
  for (int flush = 0; flush < 3; ++flush) {
    for (int i = 0; i < 5; ++i) {
      Scalar s{"tag " + std::to_string(rng() % 4) + (i % 2 ? " vs samples" : ""), value(rng),
               static_cast<int64_t>(rng() % (int64_t{1} << 40))};  // steps beyond 32 bits
      w.add_scalar(s.tag, s.value, s.step);
      written.push_back(s);
    }
    if (flush == 0) CHECK_FALSE(fs::exists(dir));  // nothing on disk before the first flush
    REQUIRE(w.flush());
  }
  const double t1 = now();
  CHECK_FALSE(w.failed());
  const auto files = event_files(dir);
  REQUIRE(files.size() == 1);
  CHECK(files[0].string() == w.path());
  // events.out.tfevents.<10-digit seconds>.<host>
  const std::string name = files[0].filename().string();
  const std::string secs = name.substr(std::strlen("events.out.tfevents."), 10);
  CHECK(secs.find_first_not_of("0123456789") == std::string::npos);
  CHECK(std::stod(secs) >= std::floor(t0));
  CHECK(std::stod(secs) <= t1);
  CHECK(name.size() > std::strlen("events.out.tfevents.") + 11);

  std::string error;
  const auto records = read_records(slurp(files[0]), &error);
  REQUIRE(error.empty());
  REQUIRE(records.size() == written.size() + 1);
  const Decoded first = decode_event(records[0]);
  CHECK(first.file_version == "brain.Event:2");
  CHECK_FALSE(first.scalar);
  for (size_t i = 0; i < written.size(); ++i) {
    const Decoded d = decode_event(records[i + 1]);
    REQUIRE(d.scalar);
    CHECK(d.tag == written[i].tag);
    CHECK(d.value == static_cast<float>(written[i].value));
    CHECK(d.step == written[i].step);
    CHECK(d.wall_time >= first.wall_time);  // the file is no younger than its events
    CHECK(d.wall_time >= t0 - 1e-3);
    CHECK(d.wall_time <= t1 + 1e-3);
  }
}

TEST_CASE("the decoder detects a corrupted length or data byte", "[tfevents]") {
  const std::string one = tfrecord(scalar_event(1.5e9, 42, "lm loss", 3.25f));
  std::string error;
  const std::string file = tfrecord(file_version_event(1.5e9)) + one;
  REQUIRE(read_records(file, &error).size() == 2);
  REQUIRE(error.empty());
  std::mt19937 rng(3);
  const size_t second = file.size() - one.size();
  for (int trial = 0; trial < 20; ++trial) {
    std::string bad = file;
    const size_t at = second + rng() % one.size();
    bad[at] = static_cast<char>(bad[at] ^ (1 + rng() % 255));
    error.clear();
    const auto records = read_records(bad, &error);
    CHECK(records.size() == 1);  // the first record still reads; the second does not
    CHECK_FALSE(error.empty());
  }
  // A flipped byte within the data is reported as such.
  std::string bad = file;
  bad[second + 12 + 3] ^= 0x10;
  error.clear();
  read_records(bad, &error);
  CHECK(error.find("data CRC mismatch") == 0);
  bad = file;
  bad[second + 1] ^= 0x01;  // the length
  error.clear();
  read_records(bad, &error);
  CHECK(error.find("length CRC mismatch") == 0);
}

TEST_CASE("a second writer in the same directory starts a file of its own", "[tfevents]") {
  test::TempDir tmp;
  std::set<std::string> paths;
  for (int run = 0; run < 3; ++run) {  // likely the same second: ".1", ".2" keep the names apart
    EventFileWriter w(tmp.str());
    w.add_scalar("lm loss", 1.0 + run, run + 1);
    REQUIRE(w.flush());
    paths.insert(w.path());
  }
  CHECK(paths.size() == 3);
  const auto files = event_files(tmp.path());
  REQUIRE(files.size() == 3);
  for (int run = 0; run < 3; ++run) {
    std::string error;
    const auto records = read_records(slurp(files[static_cast<size_t>(run)]), &error);
    REQUIRE(error.empty());
    REQUIRE(records.size() == 2);
    CHECK(decode_event(records[0]).file_version == "brain.Event:2");
  }
}

TEST_CASE("a failed write turns the writer off after one error", "[tfevents]") {
  test::TempDir tmp;
  EventFileWriter w(tmp.str("tb"));
  w.add_scalar("lm loss", 2.0, 1);
  REQUIRE(w.flush());
  set_io_fault(IoFault{FileOp::write, 1, ENOSPC, true});
  w.add_scalar("lm loss", 1.5, 2);
  const Status st = w.flush();
  set_io_fault(std::nullopt);
  REQUIRE_FALSE(st);
  CHECK(st.message().find(w.path()) != std::string::npos);
  CHECK(st.message().find("disk is full") != std::string::npos);
  CHECK(w.failed());
  w.add_scalar("lm loss", 1.0, 3);  // off: no second error, nothing more written
  CHECK(w.flush());
  std::string error;
  const auto records = read_records(slurp(w.path()), &error);
  CHECK(error.empty());
  CHECK(records.size() == 2);  // file_version and the first scalar, intact

  // A folder that cannot be created fails the first flush the same way.
  std::ofstream(tmp.str("file")) << "x";
  EventFileWriter blocked(tmp.str("file") + "/tb");
  blocked.add_scalar("lm loss", 2.0, 1);
  CHECK_FALSE(blocked.flush());
  CHECK(blocked.failed());
  CHECK(blocked.path().empty());
}

}  // namespace troupe
