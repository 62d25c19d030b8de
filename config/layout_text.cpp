// config/layout_text.hpp.
#include "config/layout_text.hpp"

#include <charconv>
#include <set>
#include <sstream>

#include <fmt/format.h>

namespace troupe {

namespace {
// A setting's word; "-" for an empty one.
std::string word(const std::string& s) { return s.empty() ? "-" : s; }
}  // namespace

std::string layout_text(const TrainConfig& c) {
  return fmt::format("tp {}\npp {}\ndp {}\ncp {}\nulysses {}\ncp_comm {}\nmicro {}\nzero {}\nschedule {}\nvpp {}\n"
                     "recompute {}\nsp {}\noffload {}\n",
                     c.tensor_model_parallel_size, c.pipeline_model_parallel_size, c.data_parallel_size,
                     c.context_parallel_size, c.ds_sequence_parallel_size, word(c.cp_comm_type), c.micro_batch_size,
                     c.zero_stage, word(c.pipeline_schedule), c.num_layers_per_virtual_pipeline_stage,
                     word(c.recompute_granularity), c.sequence_parallel ? 1 : 0, word(c.offload_optimizer));
}

Status apply_layout_text(const std::string& text, TrainConfig& c) {
  if (text.size() > 4096)
    return Status::error("auto-layout: rank 0's layout is " + std::to_string(text.size()) + " bytes, not a layout");
  std::istringstream in(text);
  std::string key, value;
  std::set<std::string> seen;
  auto integer = [&](int& out) -> bool {
    int v = 0;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    if (ec != std::errc() || end != value.data() + value.size() || v < 0 || v > (1 << 24)) return false;
    out = v;
    return true;
  };
  auto text_of = [&] { return value == "-" ? std::string() : value; };
  while (in >> key >> value) {
    if (!seen.insert(key).second) return Status::error("auto-layout: rank 0 sent " + key + " twice");
    bool ok = true;
    if (key == "tp") ok = integer(c.tensor_model_parallel_size);
    else if (key == "pp") ok = integer(c.pipeline_model_parallel_size);
    else if (key == "dp") ok = integer(c.data_parallel_size);
    else if (key == "cp") ok = integer(c.context_parallel_size);
    else if (key == "ulysses") ok = integer(c.ds_sequence_parallel_size);
    else if (key == "micro") ok = integer(c.micro_batch_size);
    else if (key == "zero") ok = integer(c.zero_stage);
    else if (key == "vpp") ok = integer(c.num_layers_per_virtual_pipeline_stage);
    else if (key == "cp_comm") c.cp_comm_type = text_of();
    else if (key == "schedule") c.pipeline_schedule = text_of();
    else if (key == "recompute") c.recompute_granularity = text_of();
    else if (key == "offload") c.offload_optimizer = text_of();
    else if (key == "sp") {
      int v = 0;
      ok = integer(v) && v <= 1;
      c.sequence_parallel = v == 1;
    } else {
      return Status::error("auto-layout: rank 0 sent an unknown setting " + key.substr(0, 32));
    }
    if (!ok) return Status::error("auto-layout: rank 0 sent " + key + " " + value.substr(0, 32) + ", not a size");
  }
  if (seen.size() != 13) return Status::error("auto-layout: rank 0's layout is incomplete");
  return Status::ok();
}

}  // namespace troupe
