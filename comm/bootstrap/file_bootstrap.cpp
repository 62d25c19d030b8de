#include "comm/bootstrap/file_bootstrap.hpp"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace troupe::comm {

namespace fs = std::filesystem;

namespace {

constexpr const char* kMagic = "troupe-file-bootstrap 1 ";

std::string escape_key(const std::string& key) {
  std::string out;
  for (unsigned char ch : key) {
    if (std::isalnum(ch) || ch == '.' || ch == '_' || ch == '-') {
      out += static_cast<char>(ch);
    } else {
      char hex[4];
      std::snprintf(hex, sizeof hex, "%%%02X", ch);
      out += hex;
    }
  }
  // "." and ".." are not file names we may use; a leading '.' would also hide the file.
  if (out.empty() || out[0] == '.') out = "%" + out;
  return out;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i == 8) {
      s += ", ... (" + std::to_string(ranks.size()) + " in all)";
      break;
    }
    s += (i ? ", " : "") + std::to_string(ranks[i]);
  }
  return s;
}

Status write_atomically(const std::string& path, const std::string& content) {
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out)
      return Status::error("cannot create " + tmp + ": check that the directory is writable");
    out.write(content.data(), static_cast<std::streamsize>(content.size()));
    out.close();
    if (!out) return Status::error("cannot write " + tmp + ": is the disk full?");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return Status::error("cannot rename " + tmp + " to " + path + ": " + ec.message());
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<FileBootstrap>> FileBootstrap::create(const std::string& dir, int rank,
                                                             int world_size,
                                                             FileBootstrapOptions options) {
  if (world_size < 1) {
    return Status::error("file bootstrap: world size " + std::to_string(world_size) +
                         " must be at least 1");
  }
  if (rank < 0 || rank >= world_size) {
    return Status::error("file bootstrap: rank " + std::to_string(rank) + " is outside [0, " +
                         std::to_string(world_size) +
                         "); pass each process a distinct rank below the world size");
  }
  if (dir.empty())
    return Status::error("file bootstrap: the directory is empty; pass a directory all ranks see");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) {
    return Status::error("file bootstrap: cannot create directory " + dir + ": " +
                         (ec ? ec.message() : std::string("exists and is not a directory")));
  }
  return std::unique_ptr<FileBootstrap>(new FileBootstrap(dir, rank, world_size, options));
}

std::string FileBootstrap::path_of(const std::string& escaped_key, int rank) const {
  return (fs::path(dir_) / (escaped_key + "." + std::to_string(rank))).string();
}

Result<std::vector<std::string>> FileBootstrap::all_gather(const std::string& key,
                                                           const std::string& mine) {
  const std::string ekey = escape_key(key);
  const std::string header = kMagic + std::to_string(world_size_) + "\n";
  TROUPE_RETURN_IF_ERROR(write_atomically(path_of(ekey, rank_), header + mine)
                             .with_context("file bootstrap, key '" + key + "': "));

  std::vector<std::string> blobs(static_cast<size_t>(world_size_));
  std::vector<bool> have(static_cast<size_t>(world_size_), false);
  int missing = world_size_;
  const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
  auto sleep = std::chrono::microseconds(1000);
  for (;;) {
    for (int r = 0; r < world_size_; ++r) {
      if (have[static_cast<size_t>(r)]) continue;
      const std::string path = path_of(ekey, r);
      std::ifstream in(path, std::ios::binary);
      if (!in) continue;  // not there yet (rename makes it appear whole)
      std::ostringstream content;
      content << in.rdbuf();
      std::string text = content.str();
      const size_t eol = text.find('\n');
      if (eol == std::string::npos || text.compare(0, eol + 1, header) != 0) {
        return Status::error(
            "file bootstrap: " + path + " does not start with '" +
            header.substr(0, header.size() - 1) + "': rank " + std::to_string(r) +
            " runs with another world size or the file is left over from another job; use a "
            "fresh directory per job and the same world size on every rank");
      }
      blobs[static_cast<size_t>(r)] = text.substr(eol + 1);
      have[static_cast<size_t>(r)] = true;
      --missing;
    }
    if (missing == 0) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      std::vector<int> absent;
      for (int r = 0; r < world_size_; ++r) {
        if (!have[static_cast<size_t>(r)]) absent.push_back(r);
      }
      return Status::error(
          "file bootstrap: timed out after " + std::to_string(options_.timeout.count()) +
          " ms waiting for key '" + key + "' from rank(s) " + rank_list(absent) + " in " + dir_ +
          "; check that those ranks started, use the same directory and world size (" +
          std::to_string(world_size_) + "), and have not failed");
    }
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, std::chrono::microseconds(20000));
  }

  // Every rank has written `key`, so every rank finished reading the previous key: drop our file of
  // it.
  if (!previous_key_.empty()) {
    std::error_code ec;
    fs::remove(path_of(previous_key_, rank_), ec);
  }
  previous_key_ = ekey;
  return blobs;
}

Status FileBootstrap::barrier(const std::string& key) {
  auto r = all_gather("barrier/" + key, "");
  return r.is_ok() ? Status::ok() : r.status();
}

}  // namespace troupe::comm
