// safetensors (storage/safetensors.hpp) and Hugging Face folders (storage/hf_import.hpp): round
// trips, the half-width conversions against a decoding written from the IEEE definitions, and every
// refusal with its message.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "storage/hf_import.hpp"
#include "storage/hf_names.hpp"
#include "storage/safetensors.hpp"
#include "tests/test_util.hpp"

using Catch::Contains;
using namespace troupe;

namespace {

std::vector<float> random_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng) + 0.25f;  // non-zero
  return v;
}

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s;
}

// A file from a header text and a buffer of `buffer` bytes.
std::string file_of(const std::string& header, size_t buffer) { return le64(header.size()) + header + std::string(buffer, '\x01'); }

Status parse(const std::string& bytes) {
  auto src = h5read::memory_source(bytes);
  return read_safetensors_header(*src, "f.safetensors: ").status();
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace

TEST_CASE("safetensors: write then read gives every tensor back bitwise", "[safetensors]") {
  test::TempDir dir;
  const std::vector<float> a = random_values(6 * 5, 1), b = random_values(7, 2), s = random_values(1, 3);
  const std::string path = dir.str("m.safetensors");
  REQUIRE(write_safetensors(path, {{"a.weight", {6, 5}, a.data()}, {"b", {7}, b.data()}, {"scalar", {}, s.data()}},
                            {{"format", "pt"}})
              .is_ok());
  auto src = h5read::open_file_source(path);
  REQUIRE(src.is_ok());
  auto header = read_safetensors_header(**src, "");
  REQUIRE(header.is_ok());
  CHECK(header->buffer_offset % 8 == 0);
  CHECK(header->metadata == std::map<std::string, std::string>{{"format", "pt"}});
  REQUIRE(header->tensors.size() == 3);
  for (auto [name, values] : {std::pair{"a.weight", &a}, std::pair{"b", &b}, std::pair{"scalar", &s}}) {
    const SafetensorsTensor* t = header->find(name);
    REQUIRE(t != nullptr);
    Tensor out = Tensor::empty(t->shape);
    REQUIRE(read_safetensors_tensor(**src, *header, *t, out, "").is_ok());
    CHECK(std::memcmp(out.data<float>(), values->data(), values->size() * 4) == 0);
  }
  CHECK(header->find("a.weight")->shape == Shape{6, 5});
  CHECK(header->find("scalar")->shape.rank() == 0);
  // The layout is the documented one: length prefix, JSON, the tensors back to back in order.
  const std::string prefix = safetensors_prefix({{"a.weight", {6, 5}, a.data()}}, {});
  CHECK(prefix.size() % 8 == 0);
  const auto j = nlohmann::json::parse(prefix.substr(8));
  CHECK(j["a.weight"]["data_offsets"] == nlohmann::json::array({0, 120}));
  CHECK(j["a.weight"]["dtype"] == "F32");
}

TEST_CASE("safetensors: F16 and BF16 widen exactly", "[safetensors]") {
  // Every F16 bit pattern against the definition: (-1)^s 2^(e-15) (1 + m/1024), subnormals 2^-14 m/1024.
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    const int s = bits >> 15, e = (bits >> 10) & 31, m = bits & 1023;
    const float got = f16_to_f32(static_cast<uint16_t>(bits));
    if (e == 31) {
      CHECK((m == 0 ? std::isinf(got) : std::isnan(got)));
      continue;
    }
    const double want = (s ? -1.0 : 1.0) * (e == 0 ? std::ldexp(m / 1024.0, -14) : std::ldexp(1.0 + m / 1024.0, e - 15));
    if (static_cast<double>(got) != want) FAIL("f16 bits " << bits << ": " << got << " != " << want);
    CHECK(std::signbit(got) == (s == 1));
  }
  for (uint32_t bits = 0; bits < 65536; bits += 7) {  // bfloat16: float32's upper half
    const float got = bf16_to_f32(static_cast<uint16_t>(bits));
    uint32_t back;
    std::memcpy(&back, &got, 4);
    CHECK(back == bits << 16);
  }
  // Through a file: the values of a half tensor come back widened.
  const uint16_t halves[3] = {0x3c00, 0xc000, 0x0001};  // 1, -2, 2^-24
  const std::string header = R"({"h":{"dtype":"F16","shape":[3],"data_offsets":[0,6]}})";
  const std::string bytes = le64(header.size()) + header + std::string(reinterpret_cast<const char*>(halves), 6);
  auto src = h5read::memory_source(bytes);
  auto h = read_safetensors_header(*src, "");
  REQUIRE(h.is_ok());
  Tensor out = Tensor::empty({3});
  REQUIRE(read_safetensors_tensor(*src, *h, h->tensors[0], out, "").is_ok());
  CHECK(out.data<float>()[0] == 1.0f);
  CHECK(out.data<float>()[1] == -2.0f);
  CHECK(out.data<float>()[2] == std::ldexp(1.0f, -24));
}

TEST_CASE("safetensors: every malformed file is refused with its reason", "[safetensors]") {
  const std::string ok = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  REQUIRE(parse(file_of(ok, 8)).is_ok());
  CHECK_THAT(parse("short").message(), Contains("too short"));
  CHECK_THAT(parse(le64(1 << 30) + ok).message(), Contains("beyond the file"));
  CHECK_THAT(parse(le64(1) + "{").message(), Contains("too small"));
  CHECK_THAT(parse(file_of(" " + ok, 8)).message(), Contains("does not start with '{'"));
  CHECK_THAT(parse(file_of("{\"a\":", 0)).message(), Contains("not valid JSON"));
  CHECK_THAT(parse(file_of("[1, 2]", 0)).message(), Contains("does not start with '{'"));
  CHECK_THAT(parse(file_of(R"({"a": 3})", 0)).message(), Contains("tensor 'a'") && Contains("not an object"));
  const std::string twice = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                            R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  CHECK_THAT(parse(file_of(twice, 8)).message(), Contains("\"a\""));
  const std::string overlap = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                              R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  CHECK_THAT(parse(file_of(overlap, 8)).message(), Contains("tensor 'b'") && Contains("overlap"));
  const std::string gap = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  CHECK_THAT(parse(file_of(gap, 8)).message(), Contains("leave bytes 0 to 4"));
  CHECK_THAT(parse(file_of(ok, 4)).message(), Contains("truncated"));
  CHECK_THAT(parse(file_of(ok, 12)).message(), Contains("longer than its header says"));
  const std::string size = R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})";
  CHECK_THAT(parse(file_of(size, 8)).message(), Contains("hold 8 bytes") && Contains("takes 12"));
  const std::string f64 = R"({"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})";
  CHECK_THAT(parse(file_of(f64, 8)).message(), Contains("F64 is not supported") && Contains("F32, F16 and BF16"));
  const std::string unknown = R"({"a":{"dtype":"Q4","shape":[1],"data_offsets":[0,8]}})";
  CHECK_THAT(parse(file_of(unknown, 8)).message(), Contains("unknown dtype \"Q4\""));
  const std::string negative = R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,8]}})";
  CHECK_THAT(parse(file_of(negative, 8)).message(), Contains("not a non-negative integer"));
  const std::string huge = R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})";
  CHECK_THAT(parse(file_of(huge, 8)).message(), Contains("more bytes than any file"));
  const std::string reversed = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})";
  CHECK_THAT(parse(file_of(reversed, 8)).message(), Contains("BEGIN <= END"));
  const std::string meta = R"({"__metadata__":{"format":1},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  CHECK_THAT(parse(file_of(meta, 8)).message(), Contains("__metadata__ key \"format\""));
  // Several problems, one message.
  const std::string two = R"({"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":"x",)"
                          R"("data_offsets":[8,12]}})";
  const std::string m = parse(file_of(two, 12)).message();
  CHECK_THAT(m, Contains("tensor 'a'") && Contains("tensor 'b'"));
  CHECK(parse(file_of(ok, 8)).is_ok());
}

TEST_CASE("hf config.json: GPT-2 accepted, anything else refused with every reason", "[safetensors][hf]") {
  // (LLaMA and BLOOM configs: tests/storage/test_hf_families.cpp.)
  auto gpt2 = parse_hf_config(R"({"model_type":"gpt2","architectures":["GPT2LMHeadModel"],"n_layer":3,"n_embd":64,)"
                              R"("n_head":4,"n_positions":128,"vocab_size":1000,"layer_norm_epsilon":1e-6,)"
                              R"("activation_function":"gelu_new","n_inner":null,"eos_token_id":999})",
                              "");
  REQUIRE(gpt2.is_ok());
  CHECK(gpt2->n_layer == 3);
  CHECK(gpt2->n_embd == 64);
  CHECK(gpt2->vocab_size == 1000);
  CHECK(gpt2->layer_norm_epsilon == 1e-6);
  CHECK(gpt2->eos_token_id == 999);
  auto defaults = parse_hf_config(R"({"model_type":"gpt2"})", "");  // GPT2Config's defaults
  REQUIRE(defaults.is_ok());
  CHECK(defaults->n_layer == 12);
  CHECK(defaults->vocab_size == 50257);
  auto llama = parse_hf_config(R"({"model_type":"mistral","architectures":["LlamaForCausalLM"],"n_embd":64,"n_head":5,)"
                               R"("activation_function":"silu","n_inner":100,"scale_attn_by_inverse_layer_idx":true})",
                               "c.json: ");
  REQUIRE_FALSE(llama.is_ok());
  CHECK(llama.status().is_bad_input());
  CHECK_THAT(llama.status().message(),
             Contains("c.json: ") && Contains("model_type") && Contains("architectures") && Contains("n_head 5") &&
                 Contains("activation_function") && Contains("n_inner") && Contains("scale_attn_by_inverse_layer_idx"));
  CHECK_THAT(parse_hf_config("[1]", "").status().message(), Contains("not a JSON object"));
  CHECK_THAT(parse_hf_config(R"({"model_type":"gpt2","n_layer":0})", "").status().message(), Contains("n_layer"));
}

TEST_CASE("hf index: the weight map, and only plain file names", "[safetensors][hf]") {
  auto ok = parse_safetensors_index(
      R"({"metadata":{"total_size":8},"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors"}})",
      "");
  REQUIRE(ok.is_ok());
  CHECK(ok->at("b") == "model-00002-of-00002.safetensors");
  auto bad = parse_safetensors_index(
      R"({"weight_map":{"a":"../secret.safetensors","b":"/etc/passwd","c":"x.bin","d":1}})", "i.json: ");
  REQUIRE_FALSE(bad.is_ok());
  for (const char* n : {"'a'", "'b'", "'c'", "'d'"}) CHECK_THAT(bad.status().message(), Contains(n));
  CHECK_THAT(parse_safetensors_index(R"({"weight_map":{}})", "").status().message(), Contains("empty"));
  CHECK_THAT(parse_safetensors_index(R"({"a":1})", "").status().message(), Contains("weight_map"));
}

TEST_CASE("hf folder: read back in troupe's orientation; missing, misshapen, extra and untied tensors refused",
          "[safetensors][hf]") {
  test::TempDir dir;
  const int64_t L = 2, C = 8, V = 11, P = 6;
  const std::string config =
      R"({"model_type":"gpt2","n_layer":2,"n_embd":8,"n_head":2,"n_positions":6,"vocab_size":11})";
  std::vector<HfTensor> names = gpt2_hf_tensors(L, V, P, C);
  std::vector<std::vector<float>> values;
  for (size_t i = 0; i < names.size(); ++i)
    values.push_back(random_values(static_cast<size_t>(names[i].hf_shape.numel()), 10 + static_cast<uint32_t>(i)));
  auto folder = [&](const std::string& name, std::vector<SafetensorsInput> tensors) {
    std::filesystem::create_directories(dir.str(name));
    write_bytes(dir.str(name + "/config.json"), config);
    REQUIRE(write_safetensors(dir.str(name + "/model.safetensors"), tensors, {}).is_ok());
    return dir.str(name);
  };
  std::vector<SafetensorsInput> all;
  for (size_t i = 0; i < names.size(); ++i) all.push_back({names[i].name, names[i].hf_shape, values[i].data()});
  const std::string good = folder("good", all);
  CHECK(is_hf_folder(good));
  auto model = read_hf_folder(good);
  REQUIRE(model.is_ok());
  REQUIRE(model->params.size() == names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    const NamedTensor& p = model->params[i];
    CHECK(p.name == names[i].name);
    REQUIRE(p.global_shape == names[i].troupe_shape);
    const float* got = p.tensor.data<float>();
    if (is_conv1d_weight(p.name)) {  // HF (in, out) -> troupe (out, in): got[o][i] = hf[i][o]
      const int64_t in = names[i].hf_shape[0], out = names[i].hf_shape[1];
      for (int64_t o = 0; o < out; ++o)
        for (int64_t k = 0; k < in; ++k) REQUIRE(got[o * in + k] == values[i][static_cast<size_t>(k * out + o)]);
    } else {
      CHECK(std::memcmp(got, values[i].data(), values[i].size() * 4) == 0);
    }
  }
  // lm_head equal to wte is accepted; a different one is refused.
  std::vector<SafetensorsInput> tied = all;
  tied.push_back({"lm_head.weight", {V, C}, values[0].data()});
  CHECK(read_hf_folder(folder("tied", tied)).is_ok());
  std::vector<float> other = values[0];  // wte with one value changed
  other[3] += 1.0f;
  std::vector<SafetensorsInput> untied = all;
  untied.push_back({"lm_head.weight", {V, C}, other.data()});
  CHECK_THAT(read_hf_folder(folder("untied", untied)).status().message(), Contains("lm_head.weight differs"));
  // Several problems at once: a missing tensor, a misshapen one, one troupe's GPT-2 has not.
  std::vector<SafetensorsInput> broken(all.begin() + 1, all.end());  // no wte
  broken[0].shape = Shape{C, P};                                      // wpe transposed
  std::vector<float> extra(4, 1.f);
  broken.push_back({"score.weight", {4}, extra.data()});
  auto refused = read_hf_folder(folder("broken", broken));
  REQUIRE_FALSE(refused.is_ok());
  CHECK(refused.status().is_bad_input());
  CHECK_THAT(refused.status().message(), Contains("'transformer.wte.weight' is missing") &&
                                             Contains("'transformer.wpe.weight' has shape (8, 6)") &&
                                             Contains("'score.weight'") && Contains("no counterpart"));
  // Not a folder of weights.
  std::filesystem::create_directories(dir.str("pickle"));
  write_bytes(dir.str("pickle/config.json"), config);
  write_bytes(dir.str("pickle/pytorch_model.bin"), "PK");
  CHECK_FALSE(is_hf_folder(dir.str("pickle")));
  CHECK_THAT(read_hf_folder(dir.str("pickle")).status().message(), Contains("pytorch_model.bin"));
}
