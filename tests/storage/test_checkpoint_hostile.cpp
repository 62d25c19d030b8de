// Checkpoints against hostile bytes and failing disks (issue 10, items 4 and 5):
// - every single flipped byte of a real shard, at every offset, and every truncation, read the way
// a
//   load reads it: never a crash, always a Status; with the whole-file check on, every one of them
//   is refused (the integrity header covers every byte);
// - metadata.json with bad numbers, names, nesting and versions: a message naming each problem;
// - the n-th create / write / fsync / rename / mkdir of a save failing with ENOSPC, EIO or EROFS:
//   an error naming the reason and the fix, no temporary left, no iteration folder left, the
//   previous checkpoint intact and still the latest, and the next save (with the fault gone) works.
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "storage/checkpoint_v1.hpp"
#include "storage/checkpoint.hpp"
#include "storage/durable.hpp"
#include "storage/h5_reader.hpp"
#include "storage/shard_file.hpp"
#include "storage/sharded_checkpoint.hpp"
#include "tests/storage/v1_writer.hpp"
#include "tests/test_util.hpp"

namespace troupe {
namespace {

namespace fs = std::filesystem;

std::vector<float> random_values(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(rng);
  return v;
}

TensorPiece make_piece(const std::string& name, const Shape& shape, std::vector<GlobalRun> runs,
                       uint32_t seed) {
  TensorPiece p;
  p.name = name;
  p.global_shape = shape;
  int64_t n = 0;
  for (const auto& r : runs) n += r.length;
  p.values = Tensor::empty({n});
  const std::vector<float> v = random_values(n, seed);
  std::memcpy(p.values.raw(), v.data(), v.size() * sizeof(float));
  p.runs = std::move(runs);
  return p;
}

// What one rank of a tensor 2 x data 2 ZeRO-1 job writes for a tiny GPT: its row block of the
// embedding, a column slice (one run per row), replicated vectors, and its ZeRO range of the
// moments.
ShardContents rank_like_contents() {
  ShardContents c;
  const int64_t V = 37, C = 12;
  auto& model = c.sections[ShardSection::model];
  model.push_back(make_piece("transformer.wte.weight", {V, C}, {{0, 19 * C}}, 1));
  model.push_back(
      make_piece("transformer.h.0.attn.c_proj.weight", {C, C},
                 runs_from_indices(C * C / 2, [&](int64_t i) { return (i / 6) * C + i % 6; }), 2));
  model.push_back(make_piece("transformer.ln_f.bias", {C}, {{0, C}}, 3));
  model.push_back(make_piece("transformer.h.0.ln_1.weight", {C}, {{0, C}}, 4));
  c.sections[ShardSection::exp_avg].push_back(
      make_piece("transformer.wte.weight", {V, C}, {{5, 100}}, 5));
  c.sections[ShardSection::exp_avg_sq].push_back(
      make_piece("transformer.wte.weight", {V, C}, {{5, 100}}, 6));
  c.sections[ShardSection::exp_avg].push_back(
      make_piece("transformer.ln_f.bias", {C}, {{0, 0 + 1}}, 7));
  c.sections[ShardSection::exp_avg_sq].push_back(
      make_piece("transformer.ln_f.bias", {C}, {{0, 1}}, 8));
  return c;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// A load's reading of one file: its index, then every tensor it holds (when they are whole in it);
// with `values`, what each read gave, by section and name. verify: the file's checksum at open;
// deferred: before its first value is read (what loads do).
enum class Verify { none, at_open, deferred };
using ReadValues = std::map<std::pair<int, std::string>, std::vector<float>>;
Status read_everything(const std::string& bytes, Verify verify, ReadValues* values = nullptr) {
  ShardReadOptions options;
  options.verify_whole_file = verify != Verify::none;
  options.verify_at_open = verify == Verify::at_open;
  auto reader = ShardSetReader::open({ShardSource{"f.h5", h5read::memory_source(bytes)}}, options);
  if (!reader) return reader.status();
  for (ShardSection s : {ShardSection::model, ShardSection::exp_avg, ShardSection::exp_avg_sq})
    for (const auto& [name, shape] : (*reader)->tensors(s)) {
      Tensor out = Tensor::empty({shape.numel()});
      TROUPE_RETURN_IF_ERROR((*reader)->read(s, name, shape, {{0, shape.numel()}}, out));
      if (values != nullptr)
        (*values)[{static_cast<int>(s), name}].assign(out.data<float>(), out.data<float>() + shape.numel());
    }
  return Status::ok();
}
Status read_everything(const std::string& bytes, bool verify) {
  return read_everything(bytes, verify ? Verify::at_open : Verify::none);
}
// Deferred checking lets a file whose damage touches nothing read pass, but never a wrong value:
// every value a read of the flipped file gives is the intact file's at that name and place.
void check_no_wrong_value(const std::string& flipped, const ReadValues& intact, size_t at) {
  ReadValues got;
  if (!read_everything(flipped, Verify::deferred, &got)) return;
  for (const auto& [key, v] : got) {
    auto it = intact.find(key);
    if (it == intact.end() || it->second != v) FAIL_CHECK("flipped byte " << at << ": a value read wrong, unchecked");
  }
}

// A whole checkpoint whose tensors each one file covers: what read_everything reads.
ShardContents whole_contents() {
  ShardContents c;
  c.sections[ShardSection::model].push_back(make_piece("a.weight", {9, 7}, {{0, 63}}, 11));
  c.sections[ShardSection::model].push_back(make_piece("a.bias", {9}, {{0, 9}}, 12));
  c.sections[ShardSection::exp_avg].push_back(
      make_piece("a.weight", {9, 7}, {{0, 40}, {40, 23}}, 13));
  c.sections[ShardSection::exp_avg_sq].push_back(make_piece("a.weight", {9, 7}, {{0, 63}}, 14));
  return c;
}

}  // namespace

TEST_CASE("hostile shards: every flipped byte and every truncation ends in a Status",
          "[checkpoint][hostile]") {
  test::TempDir dir;
  const std::string v3 = dir.str("v3.h5");
  REQUIRE(write_shard_file(v3, 0, whole_contents()));
  CheckpointContents v1_contents;
  for (const auto& [name, shape] :
       std::vector<std::pair<std::string, Shape>>{{"w", {5, 4}}, {"s", Shape{}}}) {
    Tensor t = Tensor::empty(shape);
    const auto v = random_values(shape.numel(), 21);
    std::memcpy(t.raw(), v.data(), v.size() * sizeof(float));
    v1_contents.params.push_back({name, shape, t});
    v1_contents.exp_avg.push_back({name, shape, t});
  }
  CheckpointMeta meta;
  meta.iteration = 3;
  meta.config_json = "{}";
  meta.rng_json = "{}";
  REQUIRE(test::save_v1_checkpoint(dir.str("v1"), meta, v1_contents));
  const std::string v1 = checkpoint_file(dir.str("v1"), 3);

  for (const auto& [path, headed] : {std::pair{v3, true}, std::pair{v1, false}}) {
    const std::string bytes = read_bytes(path);
    INFO(path << " (" << bytes.size() << " bytes)");
    REQUIRE(read_everything(bytes, true));
    ReadValues intact;
    REQUIRE(read_everything(bytes, Verify::deferred, &intact));
    int refused = 0, flips = 0;
    for (size_t at = 0; at < bytes.size(); ++at) {
      std::string m = bytes;
      m[at] = static_cast<char>(m[at] ^ (at % 3 == 0 ? 0xff : at % 3 == 1 ? 0x01 : 0x80));
      ++flips;
      const Status unchecked = read_everything(m, false);  // the parser, whatever the checksums say
      if (!unchecked) CHECK_FALSE(unchecked.message().empty());
      const Status checked = read_everything(m, true);
      if (!checked) ++refused;
      if (headed && checked) FAIL_CHECK("flipped byte " << at << " was not detected");
      if (headed) check_no_wrong_value(m, intact, at);
    }
    for (size_t len = 0; len < bytes.size(); len += 37) {
      const std::string cut = bytes.substr(0, len);
      CHECK_FALSE(read_everything(cut, false));
      CHECK_FALSE(read_everything(cut, true));
    }
    // A version-1 file has checksums per dataset only (its metadata has none): some flips pass.
    CHECK(refused > 0);
    CHECK(flips > 1000);
  }
}

TEST_CASE("hostile shards: real shards of every version, flipped and cut",
          "[checkpoint][hostile]") {
  // The fuzz seeds: shards written by `troupe train` (versions 2 and 3, one rank and a tensor 2 x
  // data 2 ZeRO-1 rank) and a version-1 file (fuzz/make_checkpoint_seeds.sh).
  const fs::path seeds = fs::path(test::source_dir()) / "fuzz" / "corpus" / "checkpoint_shard";
  int files = 0;
  for (const auto& e : fs::directory_iterator(seeds)) {
    const std::string bytes = read_bytes(e.path().string());
    const bool headed = e.path().filename().string().rfind("v3_", 0) == 0;
    INFO(e.path().filename().string());
    ++files;
    ReadValues intact;
    const bool whole = read_everything(bytes, Verify::deferred, &intact).is_ok();  // a rank's shard need not be
    for (size_t at = 0; at < bytes.size(); at += 7) {
      std::string m = bytes;
      m[at] = static_cast<char>(m[at] ^ (1 << (at % 8)));
      const Status unchecked = read_everything(m, false);
      if (!unchecked) CHECK_FALSE(unchecked.message().empty());
      if (headed && read_everything(m, true))
        FAIL_CHECK("flipped byte " << at << " was not detected");
      if (headed && whole) check_no_wrong_value(m, intact, at);
    }
    for (size_t len = 0; len < bytes.size(); len += 499)
      CHECK_FALSE(read_everything(bytes.substr(0, len), false));
  }
  CHECK(files >= 5);
}

TEST_CASE("hostile shards: a rank's pieces and a v3 file's header", "[checkpoint][hostile]") {
  test::TempDir dir;
  const std::string path = dir.str("shard_00000.h5");
  REQUIRE(write_shard_file(path, 0, rank_like_contents()));
  auto digest = read_shard_digest(path);
  REQUIRE(digest.is_ok());
  REQUIRE(digest->has_value());
  CHECK((*digest)->bytes == fs::file_size(path));
  // A tensor the file does not cover whole is refused at open, naming the first missing element.
  auto reader = ShardSetReader::open({path});
  REQUIRE_FALSE(reader.is_ok());
  CHECK_THAT(reader.status().message(),
             Catch::Contains("element") && Catch::Contains("is in no shard file"));
  // A header whose recorded length differs from the file's.
  std::string bytes = read_bytes(path);
  write_bytes(path, bytes + "tail");
  CHECK_FALSE(read_shard_digest(path).is_ok());
}

TEST_CASE("hostile metadata.json: every problem named, nothing thrown", "[checkpoint][hostile]") {
  const std::string good = R"({"format": "troupe-checkpoint", "format_version": 3, "iteration": 4,
    "consumed_samples": 24, "optimizer_step": 4, "config": "{}", "rng": "{}", "layout": {},
    "run": {"id": "abc"}, "shards": [{"file": "shard_00000.h5", "bytes": 1000, "crc32": 7}]})";
  auto ok = parse_checkpoint_metadata(good, "m.json");
  INFO(ok.status().message());
  REQUIRE(ok.is_ok());
  CHECK(ok->meta.iteration == 4);
  CHECK(ok->meta.run_json == R"({"id":"abc"})");
  REQUIRE(ok->digests.at(0).has_value());
  CHECK(ok->digests[0]->bytes == 1000);

  auto refused = [](const std::string& text, std::vector<std::string> wanted) {
    auto r = parse_checkpoint_metadata(text, "m.json");
    INFO(text.substr(0, 200));
    REQUIRE_FALSE(r.is_ok());
    CHECK(r.status().is_bad_input());
    for (const std::string& w : wanted) CHECK_THAT(r.status().message(), Catch::Contains(w));
  };
  auto with = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    const size_t at = s.find(from);
    REQUIRE(at != std::string::npos);
    return s.replace(at, from.size(), to);
  };
  refused(with("\"iteration\": 4", "\"iteration\": 1e400"), {"m.json", "1e400"});
  refused(with("\"iteration\": 4", "\"iteration\": -4"), {"iteration"});
  refused(with("\"optimizer_step\": 4", "\"optimizer_step\": 4.5"), {"optimizer_step"});
  refused(with("\"consumed_samples\": 24", "\"consumed_samples\": 99999999999999999999"),
          {"consumed_samples"});
  refused(with("shard_00000.h5", "../../etc/passwd"), {"shards[0]", "not a shard file name"});
  refused(with("shard_00000.h5", "/abs/shard_00000.h5"), {"not a shard file name"});
  refused(with("\"crc32\": 7", "\"crc32\": 4294967296"), {"shards[0].crc32"});
  refused(with("\"bytes\": 1000", "\"bytes\": \"big\""), {"shards[0].bytes"});
  refused(with("\"format_version\": 3", "\"format_version\": 4"), {"format version"});
  refused(with("\"config\": \"{}\"", "\"config\": {}"), {"config"});
  // Several problems at once.
  {
    std::string both = with("\"iteration\": 4,", "");
    both.replace(both.find("\"consumed_samples\": 24"), 22, "\"consumed_samples\": -1");
    refused(both, {"iteration is missing", "consumed_samples"});
  }
  refused("[" + std::string(100000, '[') + std::string(100000, ']') + "]", {"m.json"});
  refused(std::string(3, '\xff'), {"m.json"});
  refused("", {"m.json"});
  // Version 2: plain names.
  auto v2 = parse_checkpoint_metadata(
      R"({"format": "troupe-checkpoint", "format_version": 2, "iteration": 1, "consumed_samples": 0,
          "optimizer_step": 1, "config": "{}", "rng": "{}", "shards": ["shard_00000.h5", "shard_00001.h5"]})",
      "m.json");
  REQUIRE(v2.is_ok());
  CHECK(v2->shards.size() == 2);
  CHECK_FALSE(v2->digests[1].has_value());
}

TEST_CASE("hostile files: FIFOs, devices and huge files in a checkpoint never block or fill memory",
          "[checkpoint][hostile]") {
  test::TempDir tmp;
  const std::string dir = tmp.str("ck");
  CheckpointMeta meta;
  meta.iteration = 1;
  meta.config_json = meta.rng_json = "{}";
  REQUIRE(write_shard_file(shard_file_path(dir, 1, 0), 0, whole_contents()));
  REQUIRE(commit_sharded_checkpoint(dir, meta, "{}", shard_file_names(1)));
  const std::string latest = dir + "/latest_checkpointed_iteration.txt";
  const std::string metadata = iteration_dir(dir, 1) + "/metadata.json";
  const std::string shard = shard_file_path(dir, 1, 0);
  auto replace_with = [](const std::string& path, const std::string& kind) {
    fs::remove(path);
    if (kind == "fifo") REQUIRE(::mkfifo(path.c_str(), 0600) == 0);
    if (kind == "device") fs::create_symlink("/dev/zero", path);
    if (kind == "huge") {  // sparse: 1 GiB on paper
      std::ofstream(path).close();
      fs::resize_file(path, size_t{1} << 30);
    }
  };
  for (const std::string kind : {"fifo", "device", "huge"}) {
    INFO(kind);
    for (const std::string& path : {latest, metadata, shard}) {
      const std::string saved = read_bytes(path);
      replace_with(path, kind);
      Status st;
      if (path == latest) {
        st = latest_iteration(dir).status();
      } else if (path == metadata) {
        st = read_checkpoint_meta(dir, 1).status();
      } else {
        auto files = sharded_checkpoint_files(dir, 1);
        st = files ? ShardSetReader::open(files.value()).status() : files.status();
      }
      CHECK_FALSE(st.is_ok());
      CHECK(st.is_bad_input());
      CHECK_THAT(st.message(), Catch::Contains(fs::path(path).filename().string()));
      fs::remove(path);
      write_bytes(path, saved);
    }
  }
  CHECK(ShardSetReader::open(sharded_checkpoint_files(dir, 1).value()).is_ok());
}

namespace {

// A committed checkpoint of iteration 1 in dir, then a save of iteration 2 under `fault`.
struct FaultRun {
  Status shard, commit;
};

FaultRun save_under_fault(const std::string& dir, std::optional<IoFault> fault) {
  CheckpointMeta meta;
  meta.config_json = "{}";
  meta.rng_json = "{}";
  meta.iteration = 2;
  set_io_fault(fault);
  FaultRun r;
  r.shard = prepare_iteration_dir(dir, 2);
  if (r.shard) r.shard = write_shard_file(shard_file_path(dir, 2, 0), 0, whole_contents());
  if (r.shard) r.shard = write_shard_file(shard_file_path(dir, 2, 1), 1, whole_contents());
  if (r.shard) r.commit = commit_sharded_checkpoint(dir, meta, "{}", shard_file_names(2));
  set_io_fault(std::nullopt);
  return r;
}

std::vector<std::string> temporaries(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.path().extension() == ".tmp") out.push_back(e.path().string());
  return out;
}

}  // namespace

TEST_CASE("faults during a save: the previous checkpoint stays, nothing is left",
          "[checkpoint][faults]") {
  const std::pair<FileOp, const char*> ops[] = {{FileOp::create, "create"},
                                                {FileOp::write, "write"},
                                                {FileOp::fsync, "fsync"},
                                                {FileOp::rename, "rename"},
                                                {FileOp::mkdir, "mkdir"}};
  const std::pair<int, const char*> errors[] = {
      {ENOSPC, "the disk is full"}, {EIO, "I/O error"}, {EROFS, "read-only or not writable"}};
  // This save (2 shards, metadata, pointer) creates and renames 4 files, writes 8 times (a shard:
  // its header's place, its data, its header), fsyncs 10 times (each file and its folder, the
  // iteration folder, the checkpoint folder) and makes 1 folder.
  int failed_saves = 0;
  for (const auto& [op, op_name] : ops) {
    for (const auto& [err, fix] : errors) {
      const int64_t count = op == FileOp::fsync   ? 10
                            : op == FileOp::write ? 8
                            : op == FileOp::mkdir ? 1
                                                  : 4;
      for (int64_t nth = 1; nth <= count + 1; ++nth) {
        for (int variant = 0; variant < (err == ENOSPC ? 2 : 1); ++variant) {
          const bool sticky = variant == 1;
          INFO(op_name << "@" << nth << (sticky ? "+" : "") << " errno " << err);
          test::TempDir tmp;
          const std::string dir = tmp.str("ck");
          {  // iteration 1, committed
            CheckpointMeta meta;
            meta.iteration = 1;
            meta.config_json = meta.rng_json = "{}";
            REQUIRE(write_shard_file(shard_file_path(dir, 1, 0), 0, whole_contents()));
            REQUIRE(commit_sharded_checkpoint(dir, meta, "{}", shard_file_names(1)));
          }
          const std::string before = read_bytes(shard_file_path(dir, 1, 0));
          const FaultRun r = save_under_fault(dir, IoFault{op, nth, err, sticky});
          const Status& failure = !r.shard ? r.shard : r.commit;
          CHECK(temporaries(dir).empty());
          if (failure) {  // the fault hit nothing of this save (fewer such operations)
            CHECK(*latest_iteration(dir) == 2);
            continue;
          }
          ++failed_saves;
          CHECK_FALSE(failure.is_bad_input());
          CHECK_THAT(failure.message(), Catch::Contains(fix) && Catch::Contains(dir));
          if (*latest_iteration(dir) == 2) {
            // Only the fsync of the folder after the pointer's rename failed: the new checkpoint is
            // complete and named; it must load.
            CHECK(ShardSetReader::open(sharded_checkpoint_files(dir, 2).value()).is_ok());
            continue;
          }
          CHECK_FALSE(fs::exists(iteration_dir(dir, 2)));
          REQUIRE(*latest_iteration(dir) == 1);
          CHECK(read_bytes(shard_file_path(dir, 1, 0)) == before);
          auto files = sharded_checkpoint_files(dir, 1);
          REQUIRE(files.is_ok());
          auto reader = ShardSetReader::open(files.value());
          CHECK(reader.is_ok());
          // The disk is back: the same save goes through.
          const FaultRun again = save_under_fault(dir, std::nullopt);
          CHECK(again.shard);
          CHECK(again.commit);
          CHECK(*latest_iteration(dir) == 2);
        }
      }
    }
  }
  CHECK(failed_saves == (4 + 8 + 10 + 4 + 1) * 3 + (4 + 8 + 10 + 4 + 1));
}

TEST_CASE("faults during a save: version-1 files and text files too", "[checkpoint][faults]") {
  CheckpointContents c;
  Tensor t = Tensor::empty({4});
  const auto v = random_values(4, 3);
  std::memcpy(t.raw(), v.data(), sizeof(float) * 4);
  c.params.push_back({"w", {4}, t});
  CheckpointMeta meta;
  meta.config_json = meta.rng_json = "{}";
  test::TempDir tmp;
  meta.iteration = 1;
  REQUIRE(test::save_v1_checkpoint(tmp.str(), meta, c));
  for (FileOp op : {FileOp::create, FileOp::write, FileOp::fsync, FileOp::rename}) {
    for (int64_t nth = 1; nth <= 4; ++nth) {
      meta.iteration = 2;
      set_io_fault(IoFault{op, nth, ENOSPC, false});
      const Status st = test::save_v1_checkpoint(tmp.str(), meta, c);
      set_io_fault(std::nullopt);
      CHECK(temporaries(tmp.str()).empty());
      if (!st) {
        CHECK_THAT(st.message(), Catch::Contains("No space left on device"));
        CHECK(*latest_iteration(tmp.str()) == 1);
        CHECK_FALSE(fs::exists(iteration_dir(tmp.str(), 2)));
      }
      fs::remove_all(iteration_dir(tmp.str(), 2));
      REQUIRE(write_text_atomically(tmp.str("latest_checkpointed_iteration.txt"), "1\n"));
    }
  }
  // TROUPE_FAULT_IO's syntax.
  auto f = parse_io_fault("fsync@3+:EIO");
  REQUIRE(f.is_ok());
  CHECK((f->op == FileOp::fsync && f->nth == 3 && f->sticky && f->error == EIO));
  CHECK_FALSE(parse_io_fault("fsync@0:EIO").is_ok());
  CHECK_FALSE(parse_io_fault("seek@1:EIO").is_ok());
  CHECK_FALSE(parse_io_fault("write@1:EPIPE").is_ok());
}

// With ENOSPC injected at the first `op`: a 64-byte file made by `make`, filled and committed; what failed.
static Status fill_under_fault(FileOp op, const std::function<Result<MappedFileWrite>()>& make) {
  set_io_fault(IoFault{op, 1, ENOSPC, false});
  Status st = Status::ok();
  {
    auto file = make();
    if (file) {
      std::memset(file->data(), 7, 64);
      st = file->commit();
    } else {
      st = file.status();
    }
  }
  set_io_fault(std::nullopt);
  return st;
}

TEST_CASE("files written through a mapping: committed whole or not at all; mapped reads refuse what is not a file",
          "[checkpoint][faults]") {
  test::TempDir tmp;
  const std::string path = tmp.str("copy.h5");
  const auto v = random_values(1001, 9);  // an odd size
  const size_t bytes = v.size() * sizeof(float);
  write_bytes(path, "the old copy");
  // Filled and committed: the new bytes, nothing left beside them.
  {
    auto file = MappedFileWrite::create(path, bytes);
    INFO(file.status().message());
    REQUIRE(file.is_ok());
    std::memcpy(file->data(), v.data(), bytes);
    CHECK(read_bytes(path) == "the old copy");  // not yet
    REQUIRE(file->commit());
  }
  CHECK(read_bytes(path) == std::string(reinterpret_cast<const char*>(v.data()), bytes));
  CHECK(temporaries(tmp.str()).empty());
  // Dropped uncommitted, or failing at any step: the file as it was, no temporary.
  for (FileOp op : {FileOp::create, FileOp::write, FileOp::fsync, FileOp::rename}) {
    INFO(static_cast<int>(op));
    const Status st = fill_under_fault(op, [&] { return MappedFileWrite::create(path, 64); });
    CHECK_FALSE(st.is_ok());
    CHECK_THAT(st.message(), Catch::Contains("No space left on device"));
    CHECK(read_bytes(path) == std::string(reinterpret_cast<const char*>(v.data()), bytes));
    CHECK(temporaries(tmp.str()).empty());
  }
  {
    auto dropped = MappedFileWrite::create(path, 64);
    REQUIRE(dropped.is_ok());
  }
  CHECK(temporaries(tmp.str()).empty());
  CHECK(read_bytes(path).size() == bytes);
  // Read through a mapping: the bytes; a FIFO, a device or a file over the bound is refused.
  auto mapped = MappedFileRead::open(path, bytes);
  REQUIRE(mapped.is_ok());
  CHECK(std::memcmp(mapped->data(), v.data(), bytes) == 0);
  CHECK_FALSE(MappedFileRead::open(path, bytes - 1).is_ok());
  REQUIRE(::mkfifo(tmp.str("fifo").c_str(), 0600) == 0);
  CHECK(MappedFileRead::open(tmp.str("fifo"), bytes).status().is_bad_input());
  fs::create_symlink("/dev/zero", tmp.str("zero"));
  CHECK_FALSE(MappedFileRead::open(tmp.str("zero"), bytes).is_ok());  // a link is not followed
}

TEST_CASE("a file written through the mapping of a kept one: its inode, the new bytes at the new length; "
          "failures leave neither file", "[checkpoint][faults]") {
  test::TempDir tmp;
  const std::string path = tmp.str("iter_2/copy.h5"), kept = tmp.str("kept.h5");
  fs::create_directories(tmp.str("iter_2"));
  // Kept: 3001 floats; received into it: 1001 (shorter) and then 5003 (longer) floats.
  for (const auto& [old_count, new_count] : {std::pair<size_t, size_t>{3001, 1001}, {1001, 5003}}) {
    INFO(old_count << " -> " << new_count);
    const auto old_values = random_values(old_count, 3), v = random_values(new_count, 4);
    write_bytes(kept, std::string(reinterpret_cast<const char*>(old_values.data()), old_count * sizeof(float)));
    struct stat before {};
    REQUIRE(::stat(kept.c_str(), &before) == 0);
    const size_t bytes = new_count * sizeof(float);
    auto file = MappedFileWrite::reuse(path, kept, bytes);
    INFO(file.status().message());
    REQUIRE(file.is_ok());
    CHECK_FALSE(fs::exists(kept));  // it is the temporary now
    std::memcpy(file->data(), v.data(), bytes);
    REQUIRE(file->commit());
    struct stat after {};
    REQUIRE(::stat(path.c_str(), &after) == 0);
    CHECK(after.st_ino == before.st_ino);
    CHECK(read_bytes(path) == std::string(reinterpret_cast<const char*>(v.data()), bytes));
    CHECK(temporaries(tmp.str("iter_2")).empty());
  }
  // Nothing to reuse (gone, a directory, a symlink): refused, and nothing left at the temporary.
  CHECK_FALSE(MappedFileWrite::reuse(path, tmp.str("missing.h5"), 64).is_ok());
  fs::create_directories(tmp.str("dir.h5"));
  CHECK_FALSE(MappedFileWrite::reuse(path, tmp.str("dir.h5"), 64).is_ok());
  write_bytes(tmp.str("victim.txt"), "precious");
  fs::create_symlink(tmp.str("victim.txt"), tmp.str("link.h5"));
  CHECK_FALSE(MappedFileWrite::reuse(path, tmp.str("link.h5"), 64).is_ok());
  CHECK(read_bytes(tmp.str("victim.txt")) == "precious");
  CHECK(temporaries(tmp.str("iter_2")).empty());
  // A failing step: the kept file and the temporary are gone, the committed file is untouched.
  const std::string committed = read_bytes(path);
  for (FileOp op : {FileOp::rename, FileOp::write, FileOp::fsync}) {
    INFO(static_cast<int>(op));
    write_bytes(kept, "an old copy");
    const Status st = fill_under_fault(op, [&] { return MappedFileWrite::reuse(path, kept, 64); });
    CHECK_THAT(st.message(), Catch::Contains("No space left on device"));
    CHECK_FALSE(fs::exists(kept));
    CHECK(read_bytes(path) == committed);
    CHECK(temporaries(tmp.str("iter_2")).empty());
  }
}

// On a tmpfs a mapped file is sparse until written: a store to a page the full filesystem cannot give
// is a SIGBUS, which killed a process receiving a snapshot copy. The pages are reserved first now.
TEST_CASE("a file written through a mapping on a full tmpfs: an error naming the room, never a SIGBUS",
          "[checkpoint][faults]") {
  if (::geteuid() != 0) TROUPE_SKIP("mounting a small tmpfs needs root");
  test::TempDir tmp;
  const std::string dir = tmp.str("small");
  fs::create_directories(dir);
  struct Outcome {
    std::string skip, big, fits, grown;
  } out;
  // The small tmpfs in a mount namespace of this thread's own (unshare acts on the calling thread),
  // seen by nothing else, gone with the thread's namespace.
  std::thread([&] {
    if (::unshare(CLONE_NEWNS) != 0 || ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        ::mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=1m") != 0) {
      out.skip = std::strerror(errno);
      return;
    }
    auto big = MappedFileWrite::create(dir + "/big.h5", 4 << 20);
    out.big = big ? "created" : big.status().message();
    {
      auto fits = MappedFileWrite::create(dir + "/fits.h5", 512 << 10);
      if (fits) {
        std::memset(fits->data(), 7, 512 << 10);  // every page: they are there
        const Status c = fits->commit();
        out.fits = c ? "ok" : c.message();
      } else {
        out.fits = fits.status().message();
      }
    }
    write_bytes(dir + "/kept.h5", std::string(256 << 10, 'k'));
    {
      auto grown = MappedFileWrite::reuse(dir + "/grown.h5", dir + "/kept.h5", 4 << 20);
      out.grown = grown ? "reused" : grown.status().message();
    }
    ::umount2(dir.c_str(), MNT_DETACH);
  }).join();
  if (!out.skip.empty()) TROUPE_SKIP("cannot mount a small tmpfs here: " + out.skip);
  for (const std::string& refused : {out.big, out.grown}) {
    CHECK_THAT(refused, Catch::Contains("cannot reserve 4194304 bytes") && Catch::Contains("No space left on device") &&
                            Catch::Contains("needs 4 MiB; its disk has"));
  }
  CHECK(out.fits == "ok");
  CHECK(fs::is_empty(dir));  // this namespace never saw the tmpfs or its files
}

TEST_CASE("planted files and symlinks at a save's temporary names are replaced, never followed",
          "[checkpoint][faults]") {
  test::TempDir tmp;
  const std::string dir = tmp.str("ck"), victim = tmp.str("victim.txt");
  write_bytes(victim, "precious");
  fs::create_directories(iteration_dir(dir, 1));
  fs::create_symlink(victim, shard_file_path(dir, 1, 0) + ".tmp");
  fs::create_symlink(victim, iteration_dir(dir, 1) + "/metadata.json.tmp");
  fs::create_symlink(victim, dir + "/latest_checkpointed_iteration.txt.tmp");
  CheckpointMeta meta;
  meta.iteration = 1;
  meta.config_json = meta.rng_json = "{}";
  REQUIRE(write_shard_file(shard_file_path(dir, 1, 0), 0, whole_contents()));
  REQUIRE(commit_sharded_checkpoint(dir, meta, "{}", shard_file_names(1)));
  CHECK(read_bytes(victim) == "precious");
  CHECK_FALSE(fs::is_symlink(shard_file_path(dir, 1, 0)));
  CHECK((fs::status(shard_file_path(dir, 1, 0)).permissions() & fs::perms::others_write) ==
        fs::perms::none);
  CHECK(temporaries(dir).empty());
  CHECK(ShardSetReader::open(sharded_checkpoint_files(dir, 1).value()).is_ok());
}

}  // namespace troupe
