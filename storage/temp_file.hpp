// Temporary files nobody else can redirect or read: created with O_CREAT | O_EXCL | O_NOFOLLOW (a
// file or symlink already at the name makes creation fail; nothing is ever followed) and mode 0600,
// under a name with a random part, so it cannot be predicted and planted in advance either.
//
// Thread-safe. The caller owns the descriptor and the file (close it; rename or unlink it).
#pragma once
#include <sys/types.h>

#include <string>

#include "troupe/status.hpp"

namespace troupe {

struct TempFile {
  int fd = -1;
  std::string path;
};

// Creates `base` + ".tmp." + 8 random letters and digits, open for writing (and reading) with
// `extra_flags` added (e.g. O_DIRECT), retrying on a name that exists. Errors name the path, the
// system's reason, and say to check the directory.
Result<TempFile> create_temp_file(const std::string& base, int extra_flags = 0);

// The mode a file created with open(..., 0666) gets under this process's umask: what a finished
// output (renamed from a 0600 temporary) should have, as if written directly.
mode_t default_file_mode();

}  // namespace troupe
