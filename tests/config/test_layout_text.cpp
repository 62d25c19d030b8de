// config/layout_text.hpp: the layout rank 0 sends the other ranks under --auto-layout over several
// hosts reads back to the same settings, and a damaged text is refused naming what is wrong.
#include <catch2/catch.hpp>

#include "config/layout_text.hpp"

namespace troupe {

TEST_CASE("layout text: a layout reads back to the same settings", "[config]") {
  TrainConfig c;
  c.tensor_model_parallel_size = 3;
  c.pipeline_model_parallel_size = 5;
  c.data_parallel_size = 7;
  c.context_parallel_size = 2;
  c.ds_sequence_parallel_size = 1;
  c.cp_comm_type = "a2a";
  c.micro_batch_size = 11;
  c.zero_stage = 2;
  c.pipeline_schedule = "interleaved";
  c.num_layers_per_virtual_pipeline_stage = 13;
  c.recompute_granularity = "selective";
  c.sequence_parallel = true;
  c.offload_optimizer = "cpu";
  TrainConfig back;  // every setting differs from c's before
  REQUIRE(apply_layout_text(layout_text(c), back).is_ok());
  CHECK(back.tensor_model_parallel_size == 3);
  CHECK(back.pipeline_model_parallel_size == 5);
  CHECK(back.data_parallel_size == 7);
  CHECK(back.context_parallel_size == 2);
  CHECK(back.cp_comm_type == "a2a");
  CHECK(back.micro_batch_size == 11);
  CHECK(back.zero_stage == 2);
  CHECK(back.pipeline_schedule == "interleaved");
  CHECK(back.num_layers_per_virtual_pipeline_stage == 13);
  CHECK(back.recompute_granularity == "selective");
  CHECK(back.sequence_parallel);
  CHECK(back.offload_optimizer == "cpu");
  c.cp_comm_type.clear();  // an empty word travels too
  REQUIRE(apply_layout_text(layout_text(c), back).is_ok());
  CHECK(back.cp_comm_type.empty());
}

TEST_CASE("layout text: a damaged layout is refused naming the problem", "[config]") {
  const std::string good = layout_text(TrainConfig{});
  auto refused = [](const std::string& text, const std::string& says) {
    TrainConfig c;
    const Status st = apply_layout_text(text, c);
    INFO(text);
    REQUIRE_FALSE(st.is_ok());
    CHECK_THAT(st.message(), Catch::Contains(says));
  };
  refused(good + "tp 2\n", "tp twice");
  refused("tp 2\n", "incomplete");
  refused("tp -1\n", "tp -1, not a size");
  refused("tp 99999999999\n", "not a size");
  refused("sp 2\n", "sp 2, not a size");
  refused("colour blue\n", "unknown setting colour");
  refused(std::string(5000, ' '), "not a layout");
}

}  // namespace troupe
