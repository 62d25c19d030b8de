// Where the output of troupe launch's ranks goes: the console (the launcher's stdout / stderr),
// a log file, both (torchrun's --tee), or nowhere (a rank --local-ranks-filter leaves out).
//
// Layout of the files (torchrun's, torch/distributed/elastic/multiprocessing/api.py):
//   <log dir>/<rdzv id>_<6 random characters>/attempt_<restart>/<local rank>/{stdout.log, stderr.log}
// made once per launch (the same folder for every restart); the rank's folder exists for every
// local rank and holds the files its --redirects / --tee name. TORCHELASTIC_ERROR_FILE points at
// error.json there (written by a program that uses torchelastic's @record, never by troupe).
//
// A stream that only goes to a file, or only to the console unprefixed, is handed to the rank as
// the file or the launcher's own descriptor (no copy); the others go through a pipe that one
// thread copies: raw bytes to the file, whole lines with their prefix to the console.
//
// Thread safety: an OutputRouter is used by one thread (the launcher's), its copying thread aside.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "troupe/status.hpp"

namespace troupe::apps {

// One stream of one rank, as the launcher sets it up.
struct StreamPlan {
  std::string file;     // the log file, or "" for none
  bool console = true;  // also (or only) to the launcher's stream
  std::string prefix;   // before every console line ("[rank 3] ", "[default1]:"), "" for none
};

// The descriptor the rank gets for one stream, and what the launcher keeps of it.
struct StreamEnds {
  int child_fd = -1;  // to dup2 onto the rank's stdout / stderr; -1: inherit the launcher's
  int read_fd = -1;   // the pipe's read end the router copies, or -1
  int file_fd = -1;   // the log file the router writes to, or -1
};

// Opens what `plan` needs: the file (created, truncated), a pipe when the router must copy.
Result<StreamEnds> open_stream(const StreamPlan& plan);

// Makes <base>/<id>_XXXXXX (base created if missing; empty base: $TMPDIR or /tmp/torchelastic_XXXXXX
// first, as torchrun does) and returns it.
Result<std::string> make_run_log_dir(const std::string& base, const std::string& id);

// Makes <run dir>/attempt_<n>/<local>/ for every local rank (an old attempt folder is replaced).
Result<std::string> make_attempt_dir(const std::string& run_dir, int attempt, int local_ranks);

class OutputRouter {
 public:
  ~OutputRouter();
  // Copies `ends` (read_fd, file_fd) to `console` (may be null) with `prefix` on each line. Takes
  // ownership of both descriptors.
  void add(const StreamEnds& ends, FILE* console, const std::string& prefix);
  void start();
  // Waits up to `grace` for the pipes to drain (a grandchild may keep one open), then stops and
  // closes every descriptor.
  void finish(std::chrono::milliseconds grace);

 private:
  struct Stream {
    int fd, file_fd;
    FILE* console;
    std::string prefix, partial;
  };
  void run();
  void emit(Stream& s, const std::string& text);
  std::vector<Stream> streams_;
  std::thread thread_;
  std::atomic<bool> stop_{false}, done_{false};
};

}  // namespace troupe::apps
