// `troupe train --auto-layout`: the layout a job runs with, chosen by troupe plan's model on the job's
// real world (plan/search.hpp on this host as a cluster, plan/host.hpp).
//
//   one process (world_size 1)  the ranks the process runs are chosen too: every count from 1 to the
//                               cores (each rank computing on its share of them)
//   under troupe launch         world_size ranks, local_world of them on each host (nodes =
//                               world_size / local_world)
// Sizes the command line gave stay fixed (`fixed`). Bad input when nothing fits or none can run:
// the message says why (the search's closest layout) and what to change.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "plan/search.hpp"

namespace troupe::plan {

struct AutoLayout {
  Candidate best;
  std::optional<Candidate> runner_up;
  int ranks = 1;                    // ranks of the chosen layout (the world)
  std::vector<std::string> lines;   // what to print: the choice, the runner-up, their predictions
};

Result<AutoLayout> choose_layout(const TrainConfig& base, const Fixed& fixed, int world_size, int local_world);

}  // namespace troupe::plan
