// The bounded HDF5 reader (storage/h5_reader.hpp) against libhdf5 as the reference: files that
// libhdf5 writes with the settings troupe uses (and h5py's defaults) read back the same links,
// shapes, bytes and attributes, in groups big enough for several B-tree levels, with a user block,
// long strings in their own heap collections, scalars and empty datasets. What it does not read
// (chunked or compressed data, external storage, newer format settings) is refused with a message.
#include <hdf5.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "storage/h5_reader.hpp"
#include "tests/test_util.hpp"

namespace troupe {
namespace {

namespace fs = std::filesystem;

hid_t scalar_space() {
  return H5Screate(H5S_SCALAR);
}

void put_i64(hid_t obj, const char* name, int64_t v) {
  hid_t s = scalar_space();
  hid_t a = H5Acreate2(obj, name, H5T_STD_I64LE, s, H5P_DEFAULT, H5P_DEFAULT);
  REQUIRE(H5Awrite(a, H5T_NATIVE_INT64, &v) >= 0);
  H5Aclose(a);
  H5Sclose(s);
}

void put_f64(hid_t obj, const char* name, double v) {
  hid_t s = scalar_space();
  hid_t a = H5Acreate2(obj, name, H5T_IEEE_F64LE, s, H5P_DEFAULT, H5P_DEFAULT);
  REQUIRE(H5Awrite(a, H5T_NATIVE_DOUBLE, &v) >= 0);
  H5Aclose(a);
  H5Sclose(s);
}

void put_string(hid_t obj, const char* name, const std::string& v, bool variable) {
  hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, variable ? H5T_VARIABLE : std::max<size_t>(1, v.size()));
  H5Tset_cset(t, H5T_CSET_UTF8);
  hid_t s = scalar_space();
  hid_t a = H5Acreate2(obj, name, t, s, H5P_DEFAULT, H5P_DEFAULT);
  const char* p = v.c_str();
  REQUIRE(H5Awrite(a, t, variable ? static_cast<const void*>(&p) : static_cast<const void*>(p)) >=
          0);
  H5Aclose(a);
  H5Sclose(s);
  H5Tclose(t);
}

// A contiguous dataset of `dims` filled with distinct values; returns its bytes.
std::string put_dataset(hid_t loc, const std::string& name, std::vector<hsize_t> dims, bool f32,
                        uint32_t seed, hid_t dcpl = H5P_DEFAULT) {
  size_t n = 1;
  for (hsize_t d : dims) n *= d;
  std::mt19937 rng(seed);
  std::string bytes(n * (f32 ? 4 : 8), '\0');
  for (size_t i = 0; i < n; ++i) {
    if (f32) {
      const float v = static_cast<float>(rng()) / 1e9f - 2.f;
      std::memcpy(&bytes[i * 4], &v, 4);
    } else {
      const int64_t v = static_cast<int64_t>(rng()) - (int64_t{1} << 31);
      std::memcpy(&bytes[i * 8], &v, 8);
    }
  }
  hid_t s = dims.empty() ? H5Screate(H5S_SCALAR)
                         : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  hid_t d = H5Dcreate2(loc, name.c_str(), f32 ? H5T_IEEE_F32LE : H5T_STD_I64LE, s, H5P_DEFAULT,
                       dcpl, H5P_DEFAULT);
  REQUIRE(d >= 0);
  if (n > 0)
    REQUIRE(H5Dwrite(d, f32 ? H5T_NATIVE_FLOAT : H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                     bytes.data()) >= 0);
  put_i64(d, "crc32", static_cast<int64_t>(seed));
  H5Dclose(d);
  H5Sclose(s);
  return bytes;
}

std::unique_ptr<h5read::File> open_reader(const std::string& path) {
  auto src = h5read::open_file_source(path);
  REQUIRE(src.is_ok());
  auto f = h5read::File::open(src.value());
  INFO(f.status().message());
  REQUIRE(f.is_ok());
  return std::move(f).value();
}

// libhdf5's view of a group: its link names, sorted (the reference for links()).
std::vector<std::string> reference_links(const std::string& path, const std::string& group) {
  std::vector<std::string> names;
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t g = H5Gopen2(f, group.c_str(), H5P_DEFAULT);
  hsize_t idx = 0;
  H5Literate(
      g, H5_INDEX_NAME, H5_ITER_INC, &idx,
      [](hid_t, const char* name, const H5L_info_t*, void* out) -> herr_t {
        static_cast<std::vector<std::string>*>(out)->emplace_back(name);
        return 0;
      },
      &names);
  H5Gclose(g);
  H5Fclose(f);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

TEST_CASE("h5 reader: agrees with libhdf5 on groups, datasets and attributes", "[h5_reader]") {
  test::TempDir dir;
  const size_t user_block = GENERATE(size_t{0}, size_t{512}, size_t{4096});
  const std::string path = dir.str("ref.h5");
  std::map<std::string, std::string> data;  // path -> bytes
  const std::string long_text(70000, 'x');  // beyond a default 4 KiB heap collection
  {
    hid_t fcpl = H5Pcreate(H5P_FILE_CREATE);
    if (user_block > 0) H5Pset_userblock(fcpl, user_block);
    hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, fcpl, H5P_DEFAULT);
    H5Pclose(fcpl);
    put_string(f, "format", "troupe-test", true);
    put_string(f, "fixed", "fixed length", false);
    put_string(f, "empty", "", true);
    put_string(f, "long", long_text, true);
    put_i64(f, "version", -7);
    put_f64(f, "epsilon", 1e-5);
    hid_t big = H5Gcreate2(f, "big", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    // 700 links: several symbol nodes and two B-tree levels (leaf K 4, internal K 16).
    for (int i = 0; i < 700; ++i) {
      const std::string name = "t." + std::to_string(i * 7919 % 1000) + ".w";
      data["big/" + name] =
          put_dataset(big, name, {static_cast<hsize_t>(1 + i % 5), 3}, i % 3 != 0, i);
    }
    H5Gclose(big);
    hid_t opt = H5Gcreate2(f, "optimizer", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    hid_t inner = H5Gcreate2(opt, "exp_avg", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    data["optimizer/exp_avg/scalar"] = put_dataset(inner, "scalar", {}, true, 5);
    data["optimizer/exp_avg/empty"] = put_dataset(inner, "empty", {0}, true, 6);
    data["optimizer/exp_avg/cube"] = put_dataset(inner, "cube", {2, 3, 4}, true, 7);
    H5Gclose(inner);
    H5Gclose(opt);
    H5Fclose(f);
  }
  auto r = open_reader(path);
  CHECK(r->base() == user_block);
  const auto& a = r->root().attributes;
  CHECK(a.at("format").s == "troupe-test");
  CHECK(a.at("fixed").s == "fixed length");
  CHECK(a.at("empty").s.empty());
  CHECK(a.at("long").s == long_text);
  CHECK(a.at("version").i == -7);
  CHECK(a.at("epsilon").f == 1e-5);

  auto big = r->at_path("big");
  REQUIRE(big.is_ok());
  auto links = r->links(big.value());
  REQUIRE(links.is_ok());
  std::vector<std::string> names;
  for (const auto& [name, address] : links.value()) names.push_back(name);
  CHECK(names == reference_links(path, "big"));
  for (const auto& [p, bytes] : data) {
    INFO(p);
    auto o = r->at_path(p);
    REQUIRE(o.is_ok());
    REQUIRE(o->has_dataset);
    CHECK(o->data_bytes == bytes.size());
    std::string got(bytes.size(), '\0');
    REQUIRE(r->read_data(o.value(), got.data()).is_ok());
    CHECK(got == bytes);
  }
  auto scalar = r->at_path("optimizer/exp_avg/scalar");
  CHECK(scalar->scalar);
  CHECK(scalar->numel == 1);
  CHECK(scalar->type == h5read::ElementType::f32);
  auto cube = r->at_path("optimizer/exp_avg/cube");
  CHECK(cube->dims == std::vector<int64_t>{2, 3, 4});
  CHECK(cube->attributes.at("crc32").i == 7);
  CHECK_FALSE(r->at_path("optimizer/missing").is_ok());
  CHECK_THAT(r->at_path("optimizer/missing").status().message(),
             Catch::Contains("optimizer/missing"));
}

TEST_CASE("h5 reader: refuses what troupe does not write, with a message", "[h5_reader]") {
  test::TempDir dir;
  const std::string path = dir.str("other.h5");
  SECTION("chunked and compressed data") {
    hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    const hsize_t chunk = 8;
    H5Pset_chunk(dcpl, 1, &chunk);
    H5Pset_deflate(dcpl, 4);
    put_dataset(f, "z", {64}, true, 1, dcpl);
    H5Pclose(dcpl);
    H5Fclose(f);
    auto r = open_reader(path);
    auto o = r->at_path("z");
    REQUIRE_FALSE(o.is_ok());
    CHECK(o.status().is_bad_input());
    CHECK_THAT(o.status().message(), Catch::Contains("chunked"));
  }
  SECTION("external storage") {
    hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_external(dcpl, dir.str("elsewhere.bin").c_str(), 0, 64 * 4);
    put_dataset(f, "x", {64}, true, 1, dcpl);
    H5Pclose(dcpl);
    H5Fclose(f);
    auto r = open_reader(path);
    auto o = r->at_path("x");
    REQUIRE_FALSE(o.is_ok());
    CHECK_THAT(o.status().message(), Catch::Contains("external"));
  }
  SECTION("newer format settings") {
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    H5Pset_libver_bounds(fapl, H5F_LIBVER_LATEST, H5F_LIBVER_LATEST);
    hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    put_dataset(f, "x", {4}, true, 1);
    H5Fclose(f);
    H5Pclose(fapl);
    auto src = h5read::open_file_source(path);
    auto r = h5read::File::open(src.value());
    REQUIRE_FALSE(r.is_ok());
    CHECK_THAT(r.status().message(), Catch::Contains("superblock version"));
  }
  SECTION("not HDF5, empty, truncated") {
    for (const std::string& bytes : {std::string("not an hdf5 file at all"), std::string()}) {
      auto r = h5read::File::open(h5read::memory_source(bytes));
      REQUIRE_FALSE(r.is_ok());
      CHECK_THAT(r.status().message(), Catch::Contains("not an HDF5 file"));
    }
    hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    put_dataset(f, "x", {1000}, true, 1);
    H5Fclose(f);
    fs::resize_file(path, fs::file_size(path) - 100);
    auto src = h5read::open_file_source(path);
    auto r = h5read::File::open(src.value());
    REQUIRE_FALSE(r.is_ok());
    CHECK_THAT(r.status().message(), Catch::Contains("truncated"));
  }
}

}  // namespace troupe
