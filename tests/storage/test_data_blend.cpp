// Megatron's data blends (storage/data_blend.hpp): the blending indices against a plain transcription
// of build_blending_indices written here, the weights' normalisation against numpy itself, the
// parser's rules and messages, and blended / per-split data sources read end to end.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "troupe/data_source.hpp"
#include "storage/data_blend.hpp"
#include "storage/gpt_dataset.hpp"
#include "storage/indexed_dataset.hpp"
#include "tests/test_util.hpp"

namespace troupe {
namespace {

using Catch::Contains;

// Megatron-LM megatron/core/datasets/helpers.cpp build_blending_indices, transcribed: arrays for
// samples [0, size), weights used as given.
void reference_blend(const std::vector<double>& w, int64_t size, std::vector<int32_t>* dataset,
                     std::vector<int64_t>* dataset_sample) {
  std::vector<int64_t> current(w.size(), 0);
  dataset->assign(static_cast<size_t>(size), 0);
  dataset_sample->assign(static_cast<size_t>(size), 0);
  for (int64_t i = 0; i < size; ++i) {
    const double x = std::max(static_cast<double>(i), 1.0);
    int64_t arg = 0;
    double max_error = w[0] * x - static_cast<double>(current[0]);
    for (size_t d = 1; d < w.size(); ++d) {
      const double e = w[d] * x - static_cast<double>(current[d]);
      if (e > max_error) {
        max_error = e;
        arg = static_cast<int64_t>(d);
      }
    }
    (*dataset)[static_cast<size_t>(i)] = static_cast<int32_t>(arg);
    (*dataset_sample)[static_cast<size_t>(i)] = current[static_cast<size_t>(arg)];
    current[static_cast<size_t>(arg)] += 1;
  }
}

// Plain left-to-right normalisation (what BlendIndex gets handed in the tests below is already
// normalised, so its own second normalisation must reproduce the weights used here).
std::vector<double> random_weights(std::mt19937_64& rng, size_t n) {
  std::vector<double> w(n);
  std::uniform_int_distribution<int> kind(0, 4);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (auto& x : w) {
    const int k = kind(rng);
    // Zeros and small integers give exact ties, which decide by the lowest index.
    x = k == 0 ? 0.0 : k == 1 ? static_cast<double>(1 + rng() % 4) : u(rng) * std::pow(10.0, static_cast<int>(rng() % 5) - 2);
  }
  if (std::all_of(w.begin(), w.end(), [](double x) { return x == 0; })) w[rng() % n] = 0.5;
  return w;
}

TEST_CASE("blend: indices equal Megatron's build_blending_indices on random weights", "[blend]") {
  std::mt19937_64 rng(20240613);
  for (int trial = 0; trial < 40; ++trial) {
    const size_t n = 1 + rng() % 9;
    const std::vector<double> normalised = megatron_normalize(megatron_normalize(random_weights(rng, n)));
    const int64_t size = 1 + static_cast<int64_t>(rng() % 13000);  // crosses the 4096-sample blocks
    INFO("trial " << trial << ", " << n << " datasets, " << size << " samples");
    std::vector<int32_t> dataset;
    std::vector<int64_t> dataset_sample;
    // BlendIndex normalises once more, as BlendedDataset does; the reference uses what it keeps.
    BlendIndex index(normalised);
    reference_blend(index.weights(), size, &dataset, &dataset_sample);
    // In order, then in a random order (the block cache and the snapshots), then backwards.
    std::vector<int64_t> order(static_cast<size_t>(size));
    for (int64_t i = 0; i < size; ++i) order[static_cast<size_t>(i)] = i;
    int mismatches = 0;
    for (int pass = 0; pass < 3; ++pass) {
      if (pass == 1) std::shuffle(order.begin(), order.end(), rng);
      if (pass == 2) std::sort(order.rbegin(), order.rend());
      BlendIndex fresh(normalised);
      for (int64_t i : order) {
        const auto [d, s] = fresh.at(i);
        mismatches += d != dataset[static_cast<size_t>(i)] || s != dataset_sample[static_cast<size_t>(i)];
      }
    }
    CHECK(mismatches == 0);
  }
}

TEST_CASE("blend: sample counts follow the weights", "[blend]") {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    const size_t n = 2 + rng() % 6;
    BlendIndex index(random_weights(rng, n));
    const int64_t size = 20000 + static_cast<int64_t>(rng() % 5000);
    std::vector<int64_t> count(n, 0);
    for (int64_t i = 0; i < size; ++i) {
      const auto [d, s] = index.at(i);
      CHECK(s == count[static_cast<size_t>(d)]);  // each dataset's samples in order, none skipped
      ++count[static_cast<size_t>(d)];
    }
    for (size_t d = 0; d < n; ++d) {
      INFO("dataset " << d << " weight " << index.weights()[d] << " count " << count[d] << " of " << size);
      // The rule keeps every dataset within one sample (plus rounding of the ties) of its share.
      CHECK(std::abs(static_cast<double>(count[d]) - index.weights()[d] * size) <= 2.0);
    }
  }
}

std::string python_with_numpy() {
  for (std::string py : {"python3", "/usr/bin/python3"})
    if (std::system((py + " -c 'import numpy' >/dev/null 2>&1").c_str()) == 0) return py;
  return "";
}

TEST_CASE("blend: weights are normalised bit for bit as numpy (Megatron's normalize, twice)", "[blend]") {
  const std::string py = python_with_numpy();
  if (py.empty()) TROUPE_SKIP("python3 with numpy is absent");
  test::TempDir dir;
  std::mt19937_64 rng(99);
  std::vector<std::vector<double>> cases;
  for (size_t n : {1, 2, 3, 7, 8, 9, 16, 17, 100, 129, 300, 1000}) {
    std::vector<double> w(n);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    for (auto& x : w) x = u(rng) * std::pow(10.0, static_cast<int>(rng() % 7) - 3);
    cases.push_back(w);
  }
  cases.push_back({0.3, 0.7});
  cases.push_back({0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9});
  std::ofstream in(dir.str("weights.txt"));
  for (const auto& w : cases) {
    for (size_t i = 0; i < w.size(); ++i) in << (i ? " " : "") << std::hexfloat << w[i];
    in << "\n";
  }
  in.close();
  const std::string script =
      "import numpy, sys\n"
      "def normalize(w):\n"
      "    w = numpy.array(w, dtype=numpy.float64)\n"
      "    return (w / numpy.sum(w)).tolist()\n"
      "for line in open(sys.argv[1]):\n"
      "    w = [float.fromhex(x) for x in line.split()]\n"
      "    print(' '.join(x.hex() for x in normalize(normalize(w))))\n";
  std::ofstream(dir.str("normalize.py")) << script;
  const std::string cmd = py + " " + dir.str("normalize.py") + " " + dir.str("weights.txt") + " > " + dir.str("out.txt");
  REQUIRE(std::system(cmd.c_str()) == 0);
  std::ifstream out(dir.str("out.txt"));
  std::string line;
  size_t k = 0, mismatches = 0;
  while (std::getline(out, line)) {
    REQUIRE(k < cases.size());
    const std::vector<double> mine = megatron_normalize(megatron_normalize(cases[k]));
    std::istringstream fields(line);
    std::string field;
    for (size_t i = 0; fields >> field; ++i) {
      REQUIRE(i < mine.size());
      mismatches += std::strtod(field.c_str(), nullptr) != mine[i];
    }
    ++k;
  }
  CHECK(k == cases.size());
  CHECK(mismatches == 0);
}

TEST_CASE("blend: parsing follows Megatron's get_blend_from_list", "[blend]") {
  auto ok = [](std::vector<std::string> items) {
    auto b = parse_data_blend(items, "--data-path");
    INFO(b.status().message());
    REQUIRE(b.is_ok());
    return b.value();
  };
  DataBlend b = ok({"a_text_document"});
  CHECK(b.prefixes == std::vector<std::string>{"a_text_document"});
  CHECK(b.weights.empty());
  b = ok({"0.3", "a", "0.7", "b"});
  CHECK(b.prefixes == std::vector<std::string>{"a", "b"});
  CHECK(b.weights == std::vector<double>{0.3, 0.7});
  // Megatron-DeepSpeed scripts: DATA_PATH="0.5 x 0.5 y", quoted or not; tabs and newlines too.
  b = ok({"  0.5 x\t0.5\ny "});
  CHECK(b.prefixes == std::vector<std::string>{"x", "y"});
  CHECK(b.weights == std::vector<double>{0.5, 0.5});
  b = ok({"30", "x", "+70", "y", "1e-1", "z"});
  CHECK(b.weights == std::vector<double>{30, 70, 0.1});
  // Prefixes only: an odd count, or an even count with no weight.
  b = ok({"a", "b", "c"});
  CHECK(b.prefixes.size() == 3);
  CHECK(b.weights.empty());
  b = ok({"a", "b"});
  CHECK(b.prefixes == std::vector<std::string>{"a", "b"});
  CHECK(b.weights.empty());
  CHECK(ok({}).prefixes.empty());
  // A weight of 0 is allowed as long as one is positive.
  CHECK(ok({"0", "a", "1", "b"}).weights == std::vector<double>{0, 1});

  // An existing dataset whose name has a space stays whole.
  test::TempDir dir;
  const std::string spaced = dir.str("my corpus_text_document");
  std::ofstream(spaced + ".idx") << "x";
  std::ofstream(spaced + ".bin") << "x";
  CHECK(ok({spaced}).prefixes == std::vector<std::string>{spaced});
}

TEST_CASE("blend: malformed blends name every problem and the fix", "[blend]") {
  auto error = [](std::vector<std::string> items, const std::string& flag = "--data-path") {
    auto b = parse_data_blend(items, flag);
    REQUIRE_FALSE(b.is_ok());
    CHECK(b.status().is_bad_input());
    CHECK_THAT(b.status().message(), Contains(flag) && Contains(" -- "));
    return b.status().message();
  };
  CHECK_THAT(error({"0.3", "a", "0.7"}), Contains("odd number of items (3)") && Contains("'0.3' (item 1)") &&
                                             Contains("'0.7' (item 3)") && Contains("WEIGHT PREFIX"));
  CHECK_THAT(error({"0.5", "a", "b", "c"}), Contains("item 3 'b' is not a number"));
  CHECK_THAT(error({"-0.5", "a", "1", "b"}), Contains("'-0.5'") && Contains("negative"));
  CHECK_THAT(error({"inf", "a", "1", "b"}), Contains("not finite"));
  CHECK_THAT(error({"nan", "a", "1", "b"}), Contains("not finite"));
  CHECK_THAT(error({"0", "a", "0.0", "b"}, "--train-data-path"), Contains("--train-data-path") && Contains("all 0"));
  CHECK_THAT(error({"0.5", "0.5", "1", "b"}), Contains("item 2 '0.5' is a number where a dataset prefix belongs"));
  // All at once: both bad weights.
  const std::string both = error({"-1", "a", "x", "b", "nan", "c"});
  CHECK_THAT(both, Contains("item 1 '-1'") && Contains("item 3 'x'") && Contains("item 5 'nan'"));
}

// A dataset of `docs` documents whose tokens all lie in [base, base + 50): a sample's first token
// says which dataset it came from.
std::string write_dataset(const test::TempDir& dir, const std::string& name, int docs, int base, uint64_t seed) {
  const std::string prefix = dir.str(name);
  auto b = IndexedDatasetBuilder::create(prefix, IndexDType::u16);
  REQUIRE(b.is_ok());
  std::mt19937_64 rng(seed);
  for (int d = 0; d < docs; ++d) {
    std::vector<int32_t> doc(10 + rng() % 40);
    for (auto& t : doc) t = base + static_cast<int32_t>(rng() % 50);
    REQUIRE((*b)->add_item(doc).is_ok());
    (*b)->end_document();
  }
  REQUIRE((*b)->finalize().is_ok());
  return prefix;
}

TEST_CASE("blend: a blended source reads each dataset's own split windows in the blend's order", "[blend]") {
  test::TempDir dir;
  const std::string a = write_dataset(dir, "a", 60, 0, 1), b = write_dataset(dir, "b", 90, 100, 2),
                    c = write_dataset(dir, "c", 40, 200, 3);
  const int64_t S = 16, vocab = 257;
  const uint64_t seed = 1234;
  const std::string split = "90,7,3";
  auto opened = open_blended_data({{"0.2", a, "0.5", b, "0.3", c}}, split, S, seed, false, vocab);
  INFO(opened.status().message());
  REQUIRE(opened.is_ok());
  const DataSource& source = *opened.value();
  // Each member as its own dataset, split and shuffled as a single --data-path would be.
  std::vector<std::shared_ptr<DataSource>> single;
  for (const auto& p : {a, b, c}) {
    auto s = open_indexed_data(p, split, S, seed, false, vocab);
    REQUIRE(s.is_ok());
    single.push_back(s.value());
  }
  for (DataSplit sp : {DataSplit::train, DataSplit::validation}) {
    int64_t windows = 0;
    for (const auto& s : single) windows += s->num_windows(sp);
    CHECK(source.num_windows(sp) == windows);
  }
  BlendIndex index(megatron_normalize({0.2, 0.5, 0.3}));
  std::vector<int32_t> got(static_cast<size_t>(S + 1)), want(static_cast<size_t>(S + 1));
  int mismatches = 0;
  for (int64_t i = 0; i < 3000; ++i) {  // several epochs of every member
    REQUIRE(source.read(DataSplit::train, i, got.data()).is_ok());
    const auto [d, s] = index.at(i);
    REQUIRE(single[static_cast<size_t>(d)]->read(DataSplit::train, s, want.data()).is_ok());
    mismatches += got != want;
  }
  CHECK(mismatches == 0);
  // Validation: the members with a validation window, weighed as given, read in order.
  REQUIRE(source.read(DataSplit::validation, 0, got.data()).is_ok());
}

TEST_CASE("blend: prefixes without weights are weighed by their windows in each split", "[blend]") {
  test::TempDir dir;
  const std::string a = write_dataset(dir, "a", 30, 0, 4), b = write_dataset(dir, "b", 120, 100, 5);
  const int64_t S = 8;
  auto opened = open_blended_data({{a, b}}, "1", S, 9, true, 257);
  REQUIRE(opened.is_ok());
  auto sa = open_indexed_data(a, "1", S, 9, true, 257), sb = open_indexed_data(b, "1", S, 9, true, 257);
  REQUIRE((sa.is_ok() && sb.is_ok()));
  const int64_t na = (*sa)->num_windows(DataSplit::train), nb = (*sb)->num_windows(DataSplit::train);
  BlendIndex index({static_cast<double>(na), static_cast<double>(nb)});
  std::vector<int32_t> got(S + 1), want(S + 1);
  int64_t from_a = 0, mismatches = 0;
  for (int64_t i = 0; i < na + nb; ++i) {
    REQUIRE(opened.value()->read(DataSplit::train, i, got.data()).is_ok());
    const auto [d, s] = index.at(i);
    REQUIRE((d == 0 ? *sa : *sb)->read(DataSplit::train, s, want.data()).is_ok());
    mismatches += got != want;
    from_a += got[0] < 100;
  }
  CHECK(mismatches == 0);
  // One pass over the blend takes about one epoch of each.
  CHECK(std::abs(from_a - na) <= 2);
}

TEST_CASE("blend: per-split paths read whole datasets; validation comes from its own", "[blend]") {
  test::TempDir dir;
  const std::string a = write_dataset(dir, "a", 50, 0, 6), b = write_dataset(dir, "b", 50, 100, 7),
                    v = write_dataset(dir, "v", 20, 200, 8);
  DataPaths paths;
  paths.train_data_path = {"1", a, "3", b};
  paths.valid_data_path = {v};
  const int64_t S = 12;
  auto opened = open_blended_data(paths, "ignored,as,Megatron", S, 3, false, 257);
  INFO(opened.status().message());
  REQUIRE(opened.is_ok());
  const DataSource& source = *opened.value();
  auto whole_v = open_indexed_data_unsplit(v, S, 257);
  REQUIRE(whole_v.is_ok());
  CHECK(source.num_windows(DataSplit::validation) == (*whole_v)->num_windows(DataSplit::train));
  CHECK(source.num_windows(DataSplit::test) == 0);
  std::vector<int32_t> got(S + 1), want(S + 1);
  for (int64_t i = 0; i < source.num_windows(DataSplit::validation); ++i) {
    REQUIRE(source.read(DataSplit::validation, i, got.data()).is_ok());
    REQUIRE((*whole_v)->read(DataSplit::train, i, want.data()).is_ok());  // in order, unshuffled
    CHECK(got == want);
  }
  int64_t from_b = 0;
  for (int64_t i = 0; i < 400; ++i) {
    REQUIRE(source.read(DataSplit::train, i, got.data()).is_ok());
    CHECK(got[0] < 200);  // training never reads the validation corpus
    from_b += got[0] >= 100;
  }
  CHECK(std::abs(from_b - 300) <= 2);
  CHECK_FALSE(source.read(DataSplit::test, 0, got.data()).is_ok());
}

TEST_CASE("blend: every broken member is reported at once", "[blend]") {
  test::TempDir dir;
  const std::string a = write_dataset(dir, "a", 30, 0, 1);
  const std::string tiny = write_dataset(dir, "tiny", 1, 0, 2);  // too short for one window
  const std::string wide = write_dataset(dir, "wide", 30, 250, 3);  // ids up to 299
  auto opened = open_blended_data({{"0.5", a, "0.2", dir.str("missing"), "0.2", wide, "0.1", tiny}}, "969,30,1", 64, 1,
                                  false, 257);
  REQUIRE_FALSE(opened.is_ok());
  CHECK(opened.status().is_bad_input());
  const std::string m = opened.status().message();
  CHECK_THAT(m, Contains("missing") && Contains("wide.bin holds token id"));
  // The member without a window is reported once the files are sound.
  opened = open_blended_data({{"0.5", a, "0.1", tiny}}, "969,30,1", 64, 1, false, 257);
  REQUIRE_FALSE(opened.is_ok());
  CHECK_THAT(opened.status().message(), Contains("tiny") && Contains("no training window") && Contains(" -- "));
  // Weight 0 for it: accepted.
  CHECK(open_blended_data({{"0.5", a, "0", tiny}}, "969,30,1", 64, 1, false, 257).is_ok());
  // Per-split paths need training datasets.
  DataPaths only_valid;
  only_valid.valid_data_path = {a};
  opened = open_blended_data(only_valid, "", 8, 1, false, 257);
  REQUIRE_FALSE(opened.is_ok());
  CHECK_THAT(opened.status().message(), Contains("--train-data-path is required"));
}

}  // namespace
}  // namespace troupe
