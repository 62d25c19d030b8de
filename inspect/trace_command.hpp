// The inspector's `trace start [FILE]` and `trace stop [FILE]` (docs/INSPECT.md): a Chrome trace
// of a window of iterations. start remembers the iteration the job had finished; stop answers with
// every rank's spans of the iterations since then (the boards' span rings keep the last 64 steps:
// a longer window keeps its last 64), and the client writes them as a Chrome trace (FILE given at
// start or at stop).
#pragma once
#include "inspect/inspector.hpp"

namespace troupe {

void add_trace_command(InspectHub& hub);

}  // namespace troupe
