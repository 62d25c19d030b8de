// comm/bootstrap/rendezvous_place.hpp: places of the rendezvous and the node's hint file.
#include "comm/bootstrap/rendezvous_place.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "base/strict_text.hpp"

namespace troupe::comm {

namespace {

constexpr int kMaxPlaceRank = 1 << 30;

// A decimal number in [lo, hi], one spelling (no sign, no leading zero).
std::optional<int> number(std::string_view s, int lo, int hi) {
  int64_t v = 0;
  if (!parse_strict_count(s, hi, &v) || v < lo) return std::nullopt;
  return static_cast<int>(v);
}

Status bad(const std::string& what, std::string_view text) {
  const std::string shown(text.substr(0, 80));
  return Status::bad_input("rendezvous hint: " + what + " in '" + (is_printable_ascii(shown) ? shown : "(binary)") +
                           "' -- the file is written by this node's troupe train processes (TROUPE_RDZV_HINT); "
                           "remove it and the processes look for the rendezvous at MASTER_ADDR");
}

Result<RendezvousPlace> parse_place(const std::vector<std::string_view>& f, std::string_view line) {
  RendezvousPlace p;
  if (!valid_place_addr(f[1])) return bad("an address that is not 1 to 253 of [A-Za-z0-9.:_%-]", line);
  const auto port = number(f[2], 1, 65535);
  const auto rank = number(f[3], 0, kMaxPlaceRank);
  if (!port) return bad("a port outside 1..65535", line);
  if (!rank) return bad("a rank outside 0..2^30", line);
  p.addr = std::string(f[1]);
  p.port = *port;
  p.rank = *rank;
  return p;
}

std::string place_line(const char* kind, const RendezvousPlace& p) {
  return std::string(kind) + " " + p.addr + " " + std::to_string(p.port) + " " + std::to_string(p.rank) + "\n";
}

}  // namespace

bool valid_place_addr(std::string_view addr) {
  return !addr.empty() && addr.size() <= 253 && std::all_of(addr.begin(), addr.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == ':' ||
           c == '_' || c == '%' || c == '-';
  });
}

std::string place_text(const RendezvousPlace& p) {
  const bool v6 = p.addr.find(':') != std::string::npos;
  return (v6 ? "[" + p.addr + "]" : p.addr) + ":" + std::to_string(p.port) + " (rank " + std::to_string(p.rank) + ")";
}

std::string encode_hint(const RendezvousHint& h) {
  std::string s = "troupe-rdzv-hint 1\n" + place_line("at", h.at);
  if (h.standby) s += place_line("standby", *h.standby);
  return s;
}

Result<RendezvousHint> parse_hint(std::string_view text) {
  if (text.size() > kMaxHintBytes) return bad("more than " + std::to_string(kMaxHintBytes) + " bytes", text);
  if (text.empty() || text.back() != '\n') return bad("no line end at the end", text);
  auto lines = split_fields(text.substr(0, text.size() - 1), '\n');
  if (lines.size() < 2 || lines.size() > 3) return bad("not 2 or 3 lines", text);
  if (lines[0] != "troupe-rdzv-hint 1") return bad("no 'troupe-rdzv-hint 1' header", text);
  RendezvousHint h;
  for (size_t i = 1; i < lines.size(); ++i) {
    const auto f = split_fields(lines[i], ' ');
    const char* want = i == 1 ? "at" : "standby";
    if (f.size() != 4 || f[0] != want) return bad(std::string("line ") + std::to_string(i + 1) + " is not '" + want +
                                                      " ADDR PORT RANK'", lines[i]);
    auto p = parse_place(f, lines[i]);
    if (!p) return p.status();
    if (i == 1)
      h.at = std::move(p).value();
    else
      h.standby = std::move(p).value();
  }
  return h;
}

Status write_hint(const std::string& path, const RendezvousHint& h) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const std::string text = encode_hint(h);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return Status::error("cannot write the rendezvous hint " + tmp + ": " + std::strerror(errno));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  const int err = done == text.size() ? 0 : errno;
  ::close(fd);
  if (err != 0 || done != text.size() || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = err != 0 ? err : errno;
    ::unlink(tmp.c_str());
    return Status::error("cannot write the rendezvous hint " + path + ": " + std::strerror(e));
  }
  return Status::ok();
}

Result<std::optional<RendezvousHint>> read_hint(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    if (errno == ENOENT) return std::optional<RendezvousHint>{};
    return Status::error("cannot read the rendezvous hint " + path + ": " + std::strerror(errno));
  }
  std::string text(kMaxHintBytes + 1, '\0');
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  text.resize(got);
  auto h = parse_hint(text);
  if (!h) return h.status().with_context(path + ": ");
  return std::optional<RendezvousHint>(std::move(h).value());
}

}  // namespace troupe::comm
