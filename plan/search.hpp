// The layout search of `troupe plan`: every tensor-, context-, pipeline- and expert-parallel size, schedule
// (with its virtual stages), micro-batch size, ZeRO stage, recompute granularity, sequence
// parallelism and optimizer offload the command line left open, on all of the cluster's devices
// (the data-parallel size is what remains), ranked by predicted iteration time.
//
// Order of work, so that a 175B model on 1024 GPUs takes seconds: sizes that cannot divide are never
// built; the memory plan (cheap) drops what cannot fit; troupe's own validation drops what it cannot
// run; every survivor is costed with theory's bubble, and only the best are run through the
// schedule simulator and ranked again.
//
// Thread safety: pure.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "plan/cost_model.hpp"

namespace troupe::plan {

// What the command line fixed; everything absent is searched.
struct Fixed {
  std::optional<int> tp, pp, dp, cp, ulysses, ep, micro_batch, zero, layers_per_virtual_stage;
  std::optional<bool> sequence_parallel;
  std::optional<std::string> recompute, offload, schedule, cp_comm_type;
};

struct Candidate {
  TrainConfig layout;
  Prediction prediction;
};

struct SearchResult {
  std::vector<Candidate> best;        // fitting layouts, fastest first (at most `keep`)
  std::vector<Candidate> not_fitting; // the fastest layouts that do not fit (why_not says why), a few
  int64_t considered = 0;             // layouts built
  int64_t out_of_memory = 0;          // dropped by the memory plan
  int64_t not_runnable = 0;           // dropped by troupe's validation
  int64_t costed = 0, simulated = 0;
  std::string not_runnable_example;   // one of validation's reasons
};

// base: the job's TrainConfig (model, batch, precision; its parallel fields are overwritten by each
// candidate). The global batch must be given (the data-parallel size varies). Bad input when no
// layout at all can be built (e.g. a fixed size that divides no world): the message names the
// constraint; an empty `best` with `not_fitting` filled means the model fits no layout.
Result<SearchResult> search_layouts(const TrainConfig& base, const Fixed& fixed, const Cluster& cluster,
                                    const Profile& profile, int keep = 10);

// "tp 8, pp 16 (interleaved, 2 chunks), dp 8, mbs 1, ZeRO-1, recompute full, sp": one line.
std::string layout_text(const TrainConfig& layout, int64_t world);

// The smallest number of nodes (of the cluster's kind) on which the model fits some layout, searching
// up to `max_nodes`; 0 when none does.
int smallest_fitting_nodes(const TrainConfig& base, const Fixed& fixed, const Cluster& cluster, int max_nodes);

}  // namespace troupe::plan
