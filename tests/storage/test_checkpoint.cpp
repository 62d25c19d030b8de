// Checkpoints (storage/checkpoint.hpp): round trips, the latest pointer, crash leftovers,
// corruption and the Hugging Face export. Expected values come from the tensors the test wrote and
// from transposes and key lists computed here, independently of the code under test.
#include <hdf5.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "troupe/model_config.hpp"
#include "model/params.hpp"
#include "storage/checkpoint_v1.hpp"
#include "storage/hf_export.hpp"
#include "storage/checkpoint.hpp"
#include "storage/h5_file.hpp"
#include "tests/storage/v1_writer.hpp"
#include "tests/test_util.hpp"

namespace troupe {
namespace {

// export_hf of iteration `iteration` of `dir`, through the facade as `troupe ckpt export` does.
Status export_hf_of(const std::string& dir, int64_t iteration, const std::string& out) {
  auto checkpoint = Checkpoint::open(dir, iteration);
  if (!checkpoint) return checkpoint.status();
  return export_hf(*checkpoint, out);
}

namespace fs = std::filesystem;

// Non-zero values in +-[0.5, 1.5), so a zeroed or unwritten element is always visible.
Tensor random_tensor(const Shape& shape, uint32_t seed) {
  Tensor t = Tensor::empty(shape);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(0.5f, 1.5f);
  float* d = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) d[i] = (rng() & 1 ? 1.f : -1.f) * u(rng);
  return t;
}

Tensor filled(const Shape& shape, float v) {
  Tensor t = Tensor::empty(shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = v;
  return t;
}

// The first n floats of a and b are bit-identical.
bool same_prefix(const Tensor& a, const Tensor& b, int64_t n) {
  return std::memcmp(a.data<float>(), b.data<float>(), static_cast<size_t>(n) * sizeof(float)) == 0;
}

struct Spec {
  std::string name;
  Shape global;
  Shape local;  // more leading rows than global for the padded vocabulary
};

const std::vector<Spec>& test_specs() {
  static const std::vector<Spec> specs = {
      {"transformer.wte.weight", {5, 3}, {8, 3}},  // 3 padding rows
      {"odd.vector", {7}, {7}},
      {"odd.matrix", {3, 5}, {3, 5}},
      {"odd.cube", {2, 3, 4}, {2, 3, 4}},
      {"odd.single", {1, 1}, {1, 1}},
      {"odd.scalar", Shape{}, Shape{}},
  };
  return specs;
}

std::vector<NamedTensor> random_tensors(uint32_t seed) {
  std::vector<NamedTensor> out;
  for (const Spec& s : test_specs()) {
    Tensor t = random_tensor(s.local, seed++);
    out.push_back({s.name, s.global, t});
  }
  return out;
}

// Tensors of the same names and shapes holding `garbage`, for loading into.
std::vector<NamedTensor> garbage_like(const std::vector<NamedTensor>& ts, float garbage = 7.f) {
  std::vector<NamedTensor> out;
  for (const NamedTensor& t : ts)
    out.push_back({t.name, t.global_shape, filled(t.tensor.shape(), garbage)});
  return out;
}

CheckpointContents random_contents(uint32_t seed) {
  return {random_tensors(seed), random_tensors(seed + 100), random_tensors(seed + 200)};
}

CheckpointMeta test_meta(int64_t iteration) {
  CheckpointMeta m;
  m.iteration = iteration;
  m.consumed_samples = iteration * 64 + 3;
  m.optimizer_step = iteration - 1;
  m.config_json = R"({"model": {"num_layers": 2, "hidden_size": 8}, "lr": 0.0006})";
  m.rng_json = R"({"seed": 1234, "counter": )" + std::to_string(iteration) + "}";
  return m;
}

// Real rows equal the source bit for bit; padding rows are zero.
void require_loaded(const std::vector<NamedTensor>& loaded,
                    const std::vector<NamedTensor>& source) {
  REQUIRE(loaded.size() == source.size());
  for (size_t i = 0; i < loaded.size(); ++i) {
    INFO("tensor " << loaded[i].name);
    const int64_t real = loaded[i].global_shape.numel();
    CHECK(same_prefix(loaded[i].tensor, source[i].tensor, real));
    for (int64_t k = real; k < loaded[i].tensor.numel(); ++k)
      REQUIRE(loaded[i].tensor.data<float>()[k] == 0.f);
  }
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// Byte offset in the file of dataset `path` (contiguous layout).
int64_t dataset_offset(const std::string& file, const std::string& path) {
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  REQUIRE(f >= 0);
  hid_t d = H5Dopen2(f, path.c_str(), H5P_DEFAULT);
  REQUIRE(d >= 0);
  const haddr_t off = H5Dget_offset(d);
  H5Dclose(d);
  H5Fclose(f);
  REQUIRE(off != HADDR_UNDEF);
  return static_cast<int64_t>(off);
}

void flip_byte(const std::string& file, int64_t offset) {
  std::fstream io(file, std::ios::in | std::ios::out | std::ios::binary);
  io.seekg(offset);
  char c = 0;
  io.read(&c, 1);
  c = static_cast<char>(c ^ 0x10);
  io.seekp(offset);
  io.write(&c, 1);
  REQUIRE(io.good());
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

}  // namespace

TEST_CASE("checkpoint: crc32 matches the IEEE check value", "[checkpoint]") {
  REQUIRE(h5::crc32("123456789", 9) == 0xCBF43926u);
  REQUIRE(h5::crc32("", 0) == 0u);
}

TEST_CASE("checkpoint: file names follow Megatron's layout", "[checkpoint]") {
  REQUIRE(checkpoint_file("/ck", 10) == "/ck/iter_0000010/model_optim_rng.h5");
  REQUIRE(checkpoint_file("runs/a", 1234567) == "runs/a/iter_1234567/model_optim_rng.h5");
}

TEST_CASE("checkpoint: round trip restores tensors, moments and metadata", "[checkpoint]") {
  test::TempDir dir;
  const CheckpointContents saved = random_contents(1);
  const CheckpointMeta meta = test_meta(3);
  REQUIRE(test::save_v1_checkpoint(dir.str(), meta, saved).message() == "");

  CheckpointContents into{garbage_like(saved.params), garbage_like(saved.exp_avg),
                          garbage_like(saved.exp_avg_sq)};
  SECTION("with the optimizer state") {
    REQUIRE(load_checkpoint(dir.str(), 3, into, true).message() == "");
    require_loaded(into.params, saved.params);
    require_loaded(into.exp_avg, saved.exp_avg);
    require_loaded(into.exp_avg_sq, saved.exp_avg_sq);
  }
  SECTION("without it, the moments stay untouched") {
    REQUIRE(load_checkpoint(dir.str(), 3, into, false).message() == "");
    require_loaded(into.params, saved.params);
    for (const NamedTensor& t : into.exp_avg)
      for (int64_t k = 0; k < t.tensor.numel(); ++k) REQUIRE(t.tensor.data<float>()[k] == 7.f);
  }
  SECTION("metadata") {
    Result<CheckpointMeta> m = read_checkpoint_meta(dir.str(), 3);
    REQUIRE(m.status().message() == "");
    CHECK(m->iteration == 3);
    CHECK(m->consumed_samples == meta.consumed_samples);
    CHECK(m->optimizer_step == meta.optimizer_step);
    CHECK(m->config_json == meta.config_json);
    CHECK(m->rng_json == meta.rng_json);
    CHECK(m->format_version == 1);
  }
  SECTION("listing") {
    Result<std::vector<CheckpointTensorInfo>> list = list_checkpoint_tensors(dir.str(), 3);
    REQUIRE(list.status().message() == "");
    REQUIRE(list->size() == 3 * test_specs().size());
    std::map<std::string, Shape> by_path;
    for (const CheckpointTensorInfo& t : *list) by_path[t.path] = t.shape;
    CHECK(by_path.at("model/transformer.wte.weight") == Shape({5, 3}));  // real vocabulary only
    CHECK(by_path.at("optimizer/exp_avg_sq/odd.cube") == Shape({2, 3, 4}));
    CHECK(by_path.at("model/odd.scalar").rank() == 0);
  }
}

TEST_CASE("checkpoint: listing orders layer numbers numerically", "[checkpoint]") {
  test::TempDir dir;
  std::vector<NamedTensor> ts;
  for (const char* name : {"h.10.w", "h.2.w", "h.1.w", "h.1.b", "a"})
    ts.push_back({name, {2}, random_tensor({2}, 1)});
  REQUIRE(test::save_v1_checkpoint(dir.str(), test_meta(1), {ts, {}, {}}).message() == "");
  Result<std::vector<CheckpointTensorInfo>> list = list_checkpoint_tensors(dir.str(), 1);
  REQUIRE(list.is_ok());
  std::vector<std::string> paths;
  for (const CheckpointTensorInfo& t : *list) paths.push_back(t.path);
  CHECK(paths == std::vector<std::string>{"model/a", "model/h.1.b", "model/h.1.w", "model/h.2.w",
                                          "model/h.10.w"});
}

TEST_CASE("checkpoint: the file is plain HDF5 with the documented layout", "[checkpoint]") {
  test::TempDir dir;
  const CheckpointContents saved = random_contents(2);
  REQUIRE(test::save_v1_checkpoint(dir.str(), test_meta(4), saved).message() == "");
  const std::string file = checkpoint_file(dir.str(), 4);
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  REQUIRE(f >= 0);
  // The dotted global name is one dataset of /model, read here with the raw C API.
  hid_t d = H5Dopen2(f, "/model/transformer.wte.weight", H5P_DEFAULT);
  REQUIRE(d >= 0);
  std::vector<float> rows(15);
  REQUIRE(H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, rows.data()) >= 0);
  CHECK(std::memcmp(rows.data(), saved.params[0].tensor.data<float>(),
                    rows.size() * sizeof(float)) == 0);
  H5Dclose(d);
  for (const char* attr : {"format", "format_version", "iteration", "consumed_samples",
                           "optimizer_step", "config", "rng"})
    CHECK(H5Aexists(f, attr) > 0);
  CHECK(H5Lexists(f, "/optimizer/exp_avg/odd.matrix", H5P_DEFAULT) > 0);
  H5Fclose(f);
}

TEST_CASE("checkpoint: latest pointer and several iterations", "[checkpoint]") {
  test::TempDir dir;
  const CheckpointContents at5 = random_contents(10), at10 = random_contents(20);
  REQUIRE(test::save_v1_checkpoint(dir.str(), test_meta(5), at5).message() == "");
  REQUIRE(*latest_iteration(dir.str()) == 5);
  REQUIRE(test::save_v1_checkpoint(dir.str(), test_meta(10), at10).message() == "");
  REQUIRE(*latest_iteration(dir.str()) == 10);
  std::ifstream latest(dir.str("latest_checkpointed_iteration.txt"));
  std::string text((std::istreambuf_iterator<char>(latest)), std::istreambuf_iterator<char>());
  CHECK(text == "10\n");

  for (auto [it, src] : {std::pair{int64_t{5}, &at5}, std::pair{int64_t{10}, &at10}}) {
    INFO("iteration " << it);
    CheckpointContents into{garbage_like(src->params), garbage_like(src->exp_avg),
                            garbage_like(src->exp_avg_sq)};
    REQUIRE(load_checkpoint(dir.str(), it, into, true).message() == "");
    require_loaded(into.params, src->params);
    require_loaded(into.exp_avg_sq, src->exp_avg_sq);
    CHECK(read_checkpoint_meta(dir.str(), it)->consumed_samples == it * 64 + 3);
  }

  SECTION("saving the same iteration again replaces it") {
    const CheckpointContents again = random_contents(30);
    REQUIRE(test::save_v1_checkpoint(dir.str(), test_meta(10), again).message() == "");
    CheckpointContents into{garbage_like(again.params), {}, {}};
    REQUIRE(load_checkpoint(dir.str(), 10, into, true).message() == "");
    require_loaded(into.params, again.params);
    CHECK(!fs::exists(checkpoint_file(dir.str(), 10) + ".tmp"));
  }
}

TEST_CASE("checkpoint: leftovers of a crashed save are ignored", "[checkpoint]") {
  test::TempDir dir;
  const CheckpointContents at5 = random_contents(40);
  REQUIRE(test::save_v1_checkpoint(dir.str(), test_meta(5), at5).message() == "");
  // A save of iteration 10 that died mid-write: its directory, a partial file and a partial
  // pointer.
  fs::create_directories(dir.str("iter_0000010"));
  write_text(checkpoint_file(dir.str(), 10) + ".tmp", "\x89HDF\r\n\x1a\ngarbage of a crashed save");
  write_text(dir.str("latest_checkpointed_iteration.txt.tmp"), "1");

  REQUIRE(*latest_iteration(dir.str()) == 5);
  CheckpointContents into{garbage_like(at5.params), {}, {}};
  REQUIRE(load_checkpoint(dir.str(), 5, into, false).message() == "");
  require_loaded(into.params, at5.params);
  // Iteration 10 itself was never committed.
  Status st = load_checkpoint(dir.str(), 10, into, false);
  REQUIRE(!st.is_ok());
  CHECK(contains(st.message(), "iteration 10 does not exist"));
  CHECK(contains(st.message(), "holds iteration 5"));

  // The next save of iteration 10 goes through and leaves no temporary file behind.
  const CheckpointContents at10 = random_contents(50);
  REQUIRE(test::save_v1_checkpoint(dir.str(), test_meta(10), at10).message() == "");
  CHECK(!fs::exists(checkpoint_file(dir.str(), 10) + ".tmp"));
  CHECK(!fs::exists(dir.str("latest_checkpointed_iteration.txt.tmp")));
  CheckpointContents into10{garbage_like(at10.params), {}, {}};
  REQUIRE(load_checkpoint(dir.str(), *latest_iteration(dir.str()), into10, false).message() == "");
  require_loaded(into10.params, at10.params);
}

TEST_CASE("checkpoint: a flipped bit fails the checksum, naming the tensor", "[checkpoint]") {
  test::TempDir dir;
  const CheckpointContents saved = random_contents(60);
  REQUIRE(test::save_v1_checkpoint(dir.str(), test_meta(1), saved).message() == "");
  const std::string file = checkpoint_file(dir.str(), 1);
  flip_byte(file, dataset_offset(file, "/optimizer/exp_avg/odd.matrix") + 4 * 7 + 2);

  CheckpointContents into{garbage_like(saved.params), garbage_like(saved.exp_avg),
                          garbage_like(saved.exp_avg_sq)};
  // The model alone is intact.
  REQUIRE(load_checkpoint(dir.str(), 1, into, false).message() == "");
  Status st = load_checkpoint(dir.str(), 1, into, true);
  REQUIRE(!st.is_ok());
  CHECK(contains(st.message(), file));
  CHECK(contains(st.message(), "optimizer/exp_avg/odd.matrix"));
  CHECK(contains(st.message(), "checksum"));
  CHECK(contains(st.message(), " -- "));
}

TEST_CASE("checkpoint: damaged files give clear errors", "[checkpoint]") {
  test::TempDir dir;
  const CheckpointContents saved = random_contents(70);
  REQUIRE(test::save_v1_checkpoint(dir.str(), test_meta(2), saved).message() == "");
  const std::string file = checkpoint_file(dir.str(), 2);
  CheckpointContents into{garbage_like(saved.params), {}, {}};

  SECTION("truncated") {
    fs::resize_file(file, fs::file_size(file) / 2);
    Status st = load_checkpoint(dir.str(), 2, into, false);
    REQUIRE(!st.is_ok());
    CHECK(contains(st.message(), file));
    CHECK(contains(st.message(), "damaged"));
    CHECK(contains(st.message(), " -- "));
    CHECK(!read_checkpoint_meta(dir.str(), 2).is_ok());
  }
  SECTION("not HDF5") {
    write_text(file, "this is not a checkpoint");
    Status st = load_checkpoint(dir.str(), 2, into, false);
    REQUIRE(!st.is_ok());
    CHECK(contains(st.message(), file));
    CHECK(contains(st.message(), "not an HDF5 file"));
  }
  SECTION("another format version") {
    hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    REQUIRE(f >= 0);
    hid_t a = H5Aopen(f, "format_version", H5P_DEFAULT);
    const int64_t two = 2;
    REQUIRE(H5Awrite(a, H5T_NATIVE_INT64, &two) >= 0);
    H5Aclose(a);
    H5Fclose(f);
    Status st = load_checkpoint(dir.str(), 2, into, false);
    REQUIRE(!st.is_ok());
    CHECK(contains(st.message(), "format_version is 2"));
    CHECK(contains(st.message(), file));
  }
  SECTION("a renamed iteration directory") {
    fs::rename(dir.str("iter_0000002"), dir.str("iter_0000009"));
    Result<CheckpointMeta> m = read_checkpoint_meta(dir.str(), 9);
    REQUIRE(!m.is_ok());
    CHECK(contains(m.status().message(), "iter_0000002"));
  }
}

TEST_CASE("checkpoint: missing tensors and wrong shapes name the tensor", "[checkpoint]") {
  test::TempDir dir;
  CheckpointContents saved = random_contents(80);
  saved.exp_avg.clear();
  saved.exp_avg_sq.clear();
  REQUIRE(test::save_v1_checkpoint(dir.str(), test_meta(6), saved).message() == "");
  const std::string file = checkpoint_file(dir.str(), 6);

  SECTION("missing") {
    std::vector<NamedTensor> params = garbage_like(saved.params);
    params.push_back({"transformer.h.9.ln_1.weight", {3}, filled({3}, 1.f)});
    Status st = load_checkpoint(dir.str(), 6, {params, {}, {}}, false);
    REQUIRE(!st.is_ok());
    CHECK(contains(st.message(), "model/transformer.h.9.ln_1.weight"));
    CHECK(contains(st.message(), "missing"));
    CHECK(contains(st.message(), file));
  }
  SECTION("wrong shape") {
    std::vector<NamedTensor> params = garbage_like(saved.params);
    params[2] = {"odd.matrix", {3, 6}, filled({3, 6}, 1.f)};
    Status st = load_checkpoint(dir.str(), 6, {params, {}, {}}, false);
    REQUIRE(!st.is_ok());
    CHECK(contains(st.message(), "model/odd.matrix"));
    CHECK(contains(st.message(), "(3, 5)"));
    CHECK(contains(st.message(), "(3, 6)"));
  }
  SECTION("optimizer state requested but not saved") {
    CheckpointContents into{garbage_like(saved.params), garbage_like(saved.params), {}};
    Status st = load_checkpoint(dir.str(), 6, into, true);
    REQUIRE(!st.is_ok());
    CHECK(contains(st.message(), "no optimizer state"));
  }
  SECTION("invalid names are refused on save") {
    CheckpointContents bad = saved;
    bad.params[1].name = "a/b";
    CHECK(!test::save_v1_checkpoint(dir.str(), test_meta(7), bad).is_ok());
    bad.params[1].name = bad.params[0].name;
    CHECK(!test::save_v1_checkpoint(dir.str(), test_meta(7), bad).is_ok());
    CHECK(!fs::exists(checkpoint_file(dir.str(), 7)));
    CHECK(*latest_iteration(dir.str()) == 6);
  }
}

TEST_CASE("checkpoint: latest pointer errors", "[checkpoint]") {
  test::TempDir dir;
  Result<int64_t> r = latest_iteration(dir.str("nowhere"));
  REQUIRE(!r.is_ok());
  CHECK(contains(r.status().message(), "does not exist"));

  r = latest_iteration(dir.str());
  REQUIRE(!r.is_ok());
  CHECK(contains(r.status().message(), "latest_checkpointed_iteration.txt"));

  write_text(dir.str("latest_checkpointed_iteration.txt"), "release\n");
  r = latest_iteration(dir.str());
  REQUIRE(!r.is_ok());
  CHECK(contains(r.status().message(), "'release'"));

  // Pointing at an iteration that is not there: reading it names what is there.
  REQUIRE(test::save_v1_checkpoint(dir.str(), test_meta(5), random_contents(90)).message() == "");
  write_text(dir.str("latest_checkpointed_iteration.txt"), " 7 \n");
  REQUIRE(*latest_iteration(dir.str()) == 7);
  Result<CheckpointMeta> m = read_checkpoint_meta(dir.str(), 7);
  REQUIRE(!m.is_ok());
  CHECK(contains(m.status().message(), "iter_0000007"));
  CHECK(contains(m.status().message(), "holds iteration 5"));
}

// ------------------------------------------------------------------------------------------------
// Hugging Face export

namespace {

struct HfKey {
  std::string name;
  Shape shape;      // HF shape
  bool transposed;  // Conv1D weight: HF (in, out) = troupe (out, in) transposed
};

// GPT2LMHeadModel.state_dict() keys and shapes, written out from the HF architecture.
std::vector<HfKey> gpt2_lm_head_keys(int64_t L, int64_t V, int64_t P, int64_t C) {
  std::vector<HfKey> k = {{"transformer.wte.weight", {V, C}, false},
                          {"transformer.wpe.weight", {P, C}, false}};
  for (int64_t i = 0; i < L; ++i) {
    const std::string h = "transformer.h." + std::to_string(i) + ".";
    k.push_back({h + "ln_1.weight", {C}, false});
    k.push_back({h + "ln_1.bias", {C}, false});
    k.push_back({h + "attn.c_attn.weight", {C, 3 * C}, true});
    k.push_back({h + "attn.c_attn.bias", {3 * C}, false});
    k.push_back({h + "attn.c_proj.weight", {C, C}, true});
    k.push_back({h + "attn.c_proj.bias", {C}, false});
    k.push_back({h + "ln_2.weight", {C}, false});
    k.push_back({h + "ln_2.bias", {C}, false});
    k.push_back({h + "mlp.c_fc.weight", {C, 4 * C}, true});
    k.push_back({h + "mlp.c_fc.bias", {4 * C}, false});
    k.push_back({h + "mlp.c_proj.weight", {4 * C, C}, true});
    k.push_back({h + "mlp.c_proj.bias", {C}, false});
  }
  k.push_back({"transformer.ln_f.weight", {C}, false});
  k.push_back({"transformer.ln_f.bias", {C}, false});
  k.push_back({"lm_head.weight", {V, C}, false});
  return k;
}

GptConfig tiny_gpt() {
  GptConfig c;
  c.num_layers = 2;
  c.hidden_size = 8;
  c.num_attention_heads = 2;
  c.seq_length = 6;
  c.max_position_embeddings = 6;
  c.vocab_size = 11;
  c.make_vocab_size_divisible_by = 8;  // wte allocated (16, 8)
  c.layernorm_epsilon = 1e-6;
  return c;
}

// The "model" section of a training config, with TrainConfig's key names.
std::string config_json(const GptConfig& c) {
  nlohmann::json j;
  j["model"] = {{"num_layers", c.num_layers},
                {"hidden_size", c.hidden_size},
                {"num_attention_heads", c.num_attention_heads},
                {"seq_length", c.seq_length},
                {"max_position_embeddings", c.max_position_embeddings},
                {"vocab_size", c.vocab_size},
                {"layernorm_epsilon", c.layernorm_epsilon}};
  j["lr"] = 6e-4;
  return j.dump();
}

// The troupe model's own parameters (names and shapes from model/params.hpp), random values.
std::vector<NamedTensor> gpt_params(const GptConfig& c, uint32_t seed) {
  std::vector<NamedTensor> out;
  for (const ParamSpec& s : gpt2_param_specs(c))
    out.push_back({s.name, s.global_shape, random_tensor(s.local_shape, seed++)});
  return out;
}

std::vector<float> read_dataset(hid_t f, const std::string& name, Shape* shape) {
  hid_t d = H5Dopen2(f, name.c_str(), H5P_DEFAULT);
  REQUIRE(d >= 0);
  hid_t space = H5Dget_space(d);
  hsize_t dims[8] = {0};
  const int rank = H5Sget_simple_extent_ndims(space);
  H5Sget_simple_extent_dims(space, dims, nullptr);
  *shape = Shape(dims, dims + rank);
  hid_t type = H5Dget_type(d);
  CHECK(H5Tequal(type, H5T_IEEE_F32LE) > 0);
  std::vector<float> v(static_cast<size_t>(shape->numel()));
  REQUIRE(H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) >= 0);
  H5Tclose(type);
  H5Sclose(space);
  H5Dclose(d);
  return v;
}

int64_t read_int_attr(hid_t f, const char* name) {
  int64_t v = -1;
  hid_t a = H5Aopen(f, name, H5P_DEFAULT);
  REQUIRE(a >= 0);
  REQUIRE(H5Aread(a, H5T_NATIVE_INT64, &v) >= 0);
  H5Aclose(a);
  return v;
}

// A python3 that can import h5py, or "".
std::string python_with_h5py() {
  for (const char* py : {"python3", "/usr/bin/python3"})
    if (std::system((std::string(py) + " -c 'import h5py' >/dev/null 2>&1").c_str()) == 0)
      return py;
  return "";
}

}  // namespace

TEST_CASE("checkpoint: export_hf writes GPT2LMHeadModel's state dict", "[checkpoint]") {
  test::TempDir dir;
  const GptConfig cfg = tiny_gpt();
  const std::vector<NamedTensor> params = gpt_params(cfg, 100);
  CheckpointMeta meta = test_meta(3);
  meta.config_json = config_json(cfg);
  REQUIRE(test::save_v1_checkpoint(dir.str(), meta, {params, {}, {}}).message() == "");
  const std::string out = dir.str("gpt2.h5");
  REQUIRE(export_hf_of(dir.str(), 3, out).message() == "");
  CHECK(!fs::exists(out + ".tmp"));

  std::map<std::string, const NamedTensor*> source;
  for (const NamedTensor& t : params) source[t.name] = &t;
  const int64_t L = 2, V = 11, P = 6, C = 8;
  const std::vector<HfKey> keys = gpt2_lm_head_keys(L, V, P, C);

  hid_t f = H5Fopen(out.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  REQUIRE(f >= 0);
  H5G_info_t info;
  REQUIRE(H5Gget_info(f, &info) >= 0);
  CHECK(info.nlinks == keys.size());  // nothing but the state-dict keys at the root
  for (const HfKey& k : keys) {
    INFO("key " << k.name);
    REQUIRE(H5Lexists(f, k.name.c_str(), H5P_DEFAULT) > 0);
    Shape shape;
    const std::vector<float> got = read_dataset(f, k.name, &shape);
    REQUIRE(shape == k.shape);
    const NamedTensor& src =
        *source.at(k.name == "lm_head.weight" ? "transformer.wte.weight" : k.name);
    const float* s = src.tensor.data<float>();
    if (k.transposed) {
      const int64_t in = k.shape[0], outf = k.shape[1];  // troupe (out, in)
      REQUIRE(src.global_shape == Shape({outf, in}));
      for (int64_t i = 0; i < in; ++i)
        for (int64_t o = 0; o < outf; ++o) REQUIRE(got[i * outf + o] == s[o * in + i]);
    } else {
      REQUIRE(std::memcmp(got.data(), s, got.size() * sizeof(float)) == 0);
    }
  }
  CHECK(read_int_attr(f, "n_layer") == L);
  CHECK(read_int_attr(f, "n_embd") == C);
  CHECK(read_int_attr(f, "n_head") == 2);
  CHECK(read_int_attr(f, "n_positions") == P);
  CHECK(read_int_attr(f, "vocab_size") == V);
  double eps = 0;
  hid_t a = H5Aopen(f, "layer_norm_epsilon", H5P_DEFAULT);
  REQUIRE(H5Aread(a, H5T_NATIVE_DOUBLE, &eps) >= 0);
  H5Aclose(a);
  CHECK(eps == 1e-6);
  H5Fclose(f);

  SECTION("h5py sees exactly the GPT2LMHeadModel keys") {
    const std::string py = python_with_h5py();
    if (py.empty()) TROUPE_SKIP("python3 with h5py is not installed");
    const std::string script = test::source_dir() + "/tests/storage/hf_export_check.py";
    CHECK(std::system((py + " " + script + " " + out + " --layers 2").c_str()) == 0);
    // The checker can fail: a troupe checkpoint is not an HF state dict, and the layer count
    // matters.
    CHECK(std::system((py + " " + script + " " + checkpoint_file(dir.str(), 3) + " >/dev/null 2>&1")
                          .c_str()) != 0);
    CHECK(std::system((py + " " + script + " " + out + " --layers 3 >/dev/null 2>&1").c_str()) !=
          0);
  }
}

TEST_CASE("checkpoint: export_hf without model config derives sizes from shapes", "[checkpoint]") {
  test::TempDir dir;
  GptConfig cfg = tiny_gpt();
  cfg.hidden_size = 128;
  cfg.num_attention_heads = 4;
  cfg.num_layers = 1;
  CheckpointMeta meta = test_meta(1);
  meta.config_json = "{}";
  REQUIRE(test::save_v1_checkpoint(dir.str(), meta, {gpt_params(cfg, 7), {}, {}}).message() == "");
  const std::string out = dir.str("hf.h5");
  REQUIRE(export_hf_of(dir.str(), 1, out).message() == "");
  hid_t f = H5Fopen(out.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  REQUIRE(f >= 0);
  CHECK(read_int_attr(f, "n_layer") == 1);
  CHECK(read_int_attr(f, "n_embd") == 128);
  CHECK(read_int_attr(f, "n_head") == 2);  // GPT-2's head size 64 assumed
  CHECK(read_int_attr(f, "vocab_size") == 11);
  H5Fclose(f);
}

TEST_CASE("checkpoint: export_hf refuses what is not a GPT-2", "[checkpoint]") {
  test::TempDir dir;
  const GptConfig cfg = tiny_gpt();
  std::vector<NamedTensor> params = gpt_params(cfg, 3);
  CheckpointMeta meta = test_meta(2);
  meta.config_json = config_json(cfg);
  const std::string out = dir.str("hf.h5");

  SECTION("an extra tensor") {
    params.push_back({"transformer.h.0.attn.rotary", {4}, random_tensor({4}, 1)});
    REQUIRE(test::save_v1_checkpoint(dir.str(), meta, {params, {}, {}}).message() == "");
    Status st = export_hf_of(dir.str(), 2, out);
    REQUIRE(!st.is_ok());
    CHECK(contains(st.message(), "transformer.h.0.attn.rotary"));
  }
  SECTION("a missing tensor") {
    params.erase(params.begin() + 5);  // transformer.h.0.attn.c_attn.bias
    REQUIRE(test::save_v1_checkpoint(dir.str(), meta, {params, {}, {}}).message() == "");
    Status st = export_hf_of(dir.str(), 2, out);
    REQUIRE(!st.is_ok());
    CHECK(contains(st.message(), "transformer.h.0.attn.c_attn.bias"));
  }
  SECTION("a config that contradicts the shapes") {
    GptConfig other = cfg;
    other.hidden_size = 16;
    meta.config_json = config_json(other);
    REQUIRE(test::save_v1_checkpoint(dir.str(), meta, {params, {}, {}}).message() == "");
    Status st = export_hf_of(dir.str(), 2, out);
    REQUIRE(!st.is_ok());
    CHECK(contains(st.message(), "hidden_size"));
  }
  CHECK(!fs::exists(out));
  CHECK(!fs::exists(out + ".tmp"));
}

}  // namespace troupe
