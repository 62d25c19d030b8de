// The data source of `troupe train` / `troupe eval` refuses token ids outside the vocabulary at the
// dataset's full width: an int64 id 2^32 + 7 is refused up front, not trained on as 7 (issue 10).
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include "troupe/data_source.hpp"
#include "storage/indexed_dataset.hpp"
#include "tests/test_util.hpp"

namespace troupe {
namespace {

TEST_CASE("data source: an int64 token id beyond int32 is refused, not narrowed", "[data_source]") {
  test::TempDir dir;
  const std::string prefix = dir.str("wide");
  {
    auto b = IndexedDatasetBuilder::create(prefix, IndexDType::i64);
    REQUIRE(b.is_ok());
    for (int d = 0; d < 20; ++d) {
      std::vector<int32_t> doc(37);
      for (size_t i = 0; i < doc.size(); ++i) doc[i] = static_cast<int32_t>((d * 31 + i) % 257);
      REQUIRE((*b)->add_item(doc).is_ok());
      (*b)->end_document();
    }
    REQUIRE((*b)->finalize().is_ok());
  }
  REQUIRE(open_indexed_data(prefix, "969,30,1", 8, 1, false, 257).is_ok());
  REQUIRE(open_indexed_data_unsplit(prefix, 8, 257).is_ok());

  std::fstream bin(prefix + ".bin", std::ios::binary | std::ios::in | std::ios::out);
  const int64_t wide = (int64_t{1} << 32) + 7;
  bin.seekp(8 * 100);
  bin.write(reinterpret_cast<const char*>(&wide), 8);
  bin.close();
  for (auto opened : {open_indexed_data(prefix, "969,30,1", 8, 1, false, 257),
                      open_indexed_data_unsplit(prefix, 8, 257)}) {
    REQUIRE_FALSE(opened.is_ok());
    CHECK_THAT(opened.status().message(),
               Catch::Contains("token id 4294967303 (token 100 of the stream, in sequence 2)") &&
                   Catch::Contains("vocabulary of 257") && Catch::Contains("--tokenizer-type"));
  }
}

}  // namespace
}  // namespace troupe
