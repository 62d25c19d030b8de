// Files that survive a crash: the recipe every checkpoint write follows. Write under a temporary
// name, fsync the file, rename it over the final name, fsync the directory: after a crash at any
// moment the final name holds either the old or the new content, never a torn file.
#pragma once
#include <string>

#include "kernels/status.hpp"

namespace troupe {

// The directory part of a path ("." when it has none).
std::string parent_dir(const std::string& path);
// fsync of a file or (directory = true) a directory; errors name the path and the fix.
Status fsync_path(const std::string& path, bool directory);
// The second half of the recipe: the data of `tmp` reaches the disk before its new name does.
Status commit_file(const std::string& tmp, const std::string& final_path);
// The whole recipe for a small text file (PATH.tmp, then commit_file).
Status write_text_atomically(const std::string& path, const std::string& text);

}  // namespace troupe
