// Chrome trace JSON (the Trace Event Format that Perfetto and chrome://tracing open) of the ranks'
// spans: one track per rank, named "rank R (tp T, pp P, dp D)", complete ("X") events with the span's
// category (forward, backward, weight, wait, reduce, optimizer) and micro-batch in the name.
#pragma once
#include <string>
#include <vector>

#include "troupe/status.hpp"
#include "comm/topology.hpp"
#include "engine/rank_engine.hpp"

namespace troupe {

// Writes atomically (temporary file, rename). Errors name the file.
Status write_chrome_trace(const std::string& path, const comm::Topology& topology,
                          const std::vector<RankTimeline>& timelines);

// Spans as JSON text, to gather them from the ranks of a multi-process job.
std::string timelines_to_json(const std::vector<RankTimeline>& timelines);
Result<std::vector<RankTimeline>> timelines_from_json(const std::string& text);

// Per rank: the share of the traced wall time (first span start to last span end of that rank's
// steps) spent in forward, backward and weight spans; 1 - that is the rank's bubble.
struct BusyShare {
  int rank = 0;
  double busy = 0, span_us = 0;
};
std::vector<BusyShare> busy_shares(const std::vector<RankTimeline>& timelines);

}  // namespace troupe
