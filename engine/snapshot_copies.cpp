// engine/snapshot_copies.hpp.
#include "engine/snapshot_copies.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <set>

#include <fmt/format.h>

#include "base/strict_text.hpp"
#include "engine/buffer_recycler.hpp"
#include "storage/durable.hpp"
#include "storage/shard_file.hpp"

namespace troupe {

namespace fs = std::filesystem;

namespace {

// Processes by node, each node's in world-rank order; nodes ascending.
std::map<int, std::vector<int>> processes_by_node(const std::vector<SnapshotPeer>& peers) {
  std::map<int, std::vector<int>> by_node;
  for (size_t p = 0; p < peers.size(); ++p) by_node[peers[p].node].push_back(static_cast<int>(p));
  return by_node;
}

// Tags of the copies' communicator (below 2^56): a snapshot's exchange by iteration, a start's
// fetches by shard; each a size message, then the bytes.
constexpr uint64_t kFetchTags = uint64_t{1} << 52;
uint64_t exchange_tag(int64_t iteration, int kind) {
  return ((static_cast<uint64_t>(iteration) & ((uint64_t{1} << 48) - 1)) << 2) | static_cast<uint64_t>(kind);
}
uint64_t fetch_tag(int shard, int kind) { return kFetchTags | (static_cast<uint64_t>(shard) << 2) | static_cast<uint64_t>(kind); }

// The most bytes a copy received may claim: the machine's memory (a peer's size is checked before
// anything is allocated for it).
uint64_t max_copy_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : uint64_t{1} << 40;
}

// A file to send: its bytes in memory, or mapped (a snapshot's own shard: sent from its pages).
struct Outgoing {
  int peer = 0;
  uint64_t tag = 0;  // the size goes under tag, the bytes under tag + 1
  std::string bytes;
  std::optional<MappedFileRead> mapped;
  const uint8_t* data() const { return mapped ? mapped->data() : reinterpret_cast<const uint8_t*>(bytes.data()); }
  uint64_t size() const { return mapped ? mapped->size() : bytes.size(); }
};
// A file to receive: into `bytes`, or (with `place`) into where place() says once its size is known
// (a snapshot's copy: the pages of its file).
struct Incoming {
  int peer = 0;
  uint64_t tag = 0;
  std::string bytes;
  std::function<Result<uint8_t*>(uint64_t)> place;
  uint8_t* data = nullptr;
  uint64_t size = 0;
};

// Sends and receives whole files between processes: the sizes first, then the bytes, every
// operation posted before any is waited for (so no order of peers can deadlock).
Status move_files(comm::Communicator& comm, std::vector<Outgoing>& out, std::vector<Incoming>& in) {
  std::vector<uint64_t> sizes(out.size()), got(in.size());
  std::vector<comm::WorkPtr> work;
  for (size_t i = 0; i < out.size(); ++i) {
    sizes[i] = out[i].size();
    work.push_back(comm.send(&sizes[i], 1, DType::i64, out[i].peer, out[i].tag));
  }
  for (size_t i = 0; i < in.size(); ++i) work.push_back(comm.recv(&got[i], 1, DType::i64, in[i].peer, in[i].tag));
  Status st = Status::ok();
  for (auto& w : work)
    if (Status s = w->wait(); !s && st) st = s;
  TROUPE_RETURN_IF_ERROR(st);
  work.clear();
  const uint64_t max = max_copy_bytes();
  for (size_t i = 0; i < in.size(); ++i) {
    if (got[i] > max)
      return Status::error(fmt::format("process {} announced a snapshot shard of {} bytes, more than this host's "
                                       "memory -- report this",
                                       in[i].peer, got[i]));
    in[i].size = got[i];
    if (in[i].place) {
      Result<uint8_t*> at = in[i].place(got[i]);
      if (!at && st) st = at.status();
      in[i].data = at ? at.value() : nullptr;
    } else {
      in[i].bytes.assign(static_cast<size_t>(got[i]), '\0');
      in[i].data = reinterpret_cast<uint8_t*>(in[i].bytes.data());
    }
  }
  // (A receiver that could not place a file still takes part: its peer's send must complete.)
  std::vector<std::string> spill(in.size());
  for (size_t i = 0; i < in.size(); ++i)
    if (in[i].data == nullptr && in[i].size > 0) {
      spill[i].assign(static_cast<size_t>(in[i].size), '\0');
      in[i].data = reinterpret_cast<uint8_t*>(spill[i].data());
    }
  for (Outgoing& o : out)
    if (o.size() > 0)
      work.push_back(comm.send(const_cast<uint8_t*>(o.data()), o.size(), DType::u8, o.peer, o.tag + 1));
  for (Incoming& i : in)
    if (i.size > 0) work.push_back(comm.recv(i.data, i.size, DType::u8, i.peer, i.tag + 1));
  for (auto& w : work)
    if (Status s = w->wait(); !s && st) st = s;
  return st;
}

// A received copy, checked against its checksum, into `path`.
Status write_copy(const std::string& path, std::string_view bytes, int from) {
  auto digest = verify_shard_bytes(bytes, path + fmt::format(" (as received from process {})", from));
  if (!digest) return digest.status();
  TROUPE_RETURN_IF_ERROR(make_directories(parent_dir(path)));
  return write_file_atomically(path, {{bytes.data(), bytes.size()}});
}

Result<std::string> read_shard(const std::string& path) { return read_small_file(path, max_copy_bytes()); }

}  // namespace

std::vector<int> snapshot_buddies(const std::vector<SnapshotPeer>& peers) {
  std::vector<int> buddies(peers.size(), -1);
  const auto by_node = processes_by_node(peers);
  if (by_node.size() < 2) return buddies;
  for (auto it = by_node.begin(); it != by_node.end(); ++it) {
    auto next = std::next(it) == by_node.end() ? by_node.begin() : std::next(it);
    const std::vector<int>& there = next->second;
    for (size_t i = 0; i < it->second.size(); ++i) {
      const int p = it->second[i];
      const size_t place = static_cast<size_t>(std::max(0, peers[static_cast<size_t>(p)].local_rank)) % there.size();
      buddies[static_cast<size_t>(p)] = there[place];
    }
  }
  return buddies;
}

RecoveryPlan plan_snapshot_recovery(const std::vector<SnapshotReport>& reports, const std::vector<SnapshotPeer>& peers,
                                    const std::vector<std::vector<int>>& reads) {
  RecoveryPlan plan;
  const int world = static_cast<int>(peers.size());
  if (reports.size() != peers.size() || reports.empty()) return plan;
  const SnapshotReport& lead = reports[0];
  if (!lead.restarted || lead.expected_run.empty()) return plan;
  // Which processes' hosts hold each iteration's shards. A snapshot's shard count is its own
  // layout's, which need not be this job's (an elastic round of more or fewer nodes loads it
  // resharded); reports that disagree on it are left out.
  std::map<int64_t, std::vector<std::vector<int>>> holders;  // iteration -> shard -> processes
  std::map<int64_t, int> with_metadata;
  for (int p = 0; p < world; ++p)
    for (const HeldIteration& h : reports[static_cast<size_t>(p)].held) {
      if (h.run_id != lead.expected_run || h.shards < 1 || h.iteration <= lead.disk_latest) continue;
      auto& by_shard = holders[h.iteration];
      if (by_shard.empty()) by_shard.resize(static_cast<size_t>(h.shards));
      if (by_shard.size() != static_cast<size_t>(h.shards)) continue;
      for (int s : h.present)
        if (s >= 0 && s < h.shards) by_shard[static_cast<size_t>(s)].push_back(p);
      with_metadata.emplace(h.iteration, p);
    }
  for (auto it = holders.rbegin(); it != holders.rend(); ++it) {
    const auto& by_shard = it->second;
    const int shards = static_cast<int>(by_shard.size());
    if (!std::all_of(by_shard.begin(), by_shard.end(), [](const std::vector<int>& h) { return !h.empty(); })) continue;
    plan.iteration = it->first;
    plan.metadata_from = with_metadata.at(it->first);
    // The layout that wrote it (one shard per process of this job) says which shards each rank reads.
    const bool known = shards == world && static_cast<int>(reads.size()) == shards;
    plan.by_reads = known;
    for (const auto& [node, procs] : processes_by_node(peers)) {
      std::set<int> here, needed;
      for (int s = 0; s < shards; ++s)
        for (int q : by_shard[static_cast<size_t>(s)])
          if (peers[static_cast<size_t>(q)].node == node) here.insert(s);
      for (int p : procs)
        if (known)
          for (int s : reads[static_cast<size_t>(p)])
            if (s >= 0 && s < shards) needed.insert(s);
      for (int s = 0; s < shards; ++s) {
        if (here.count(s) != 0 || (known && needed.count(s) == 0)) continue;
        const std::vector<int>& from = by_shard[static_cast<size_t>(s)];
        plan.fetches.push_back({s, from[static_cast<size_t>(s) % from.size()], procs[static_cast<size_t>(s) % procs.size()]});
      }
    }
    break;
  }
  return plan;
}

SnapshotCopies::SnapshotCopies(comm::Bootstrap& bootstrap, std::unique_ptr<comm::Communicator> comm,
                               std::vector<SnapshotPeer> peers, int rank)
    : bootstrap_(bootstrap), comm_(std::move(comm)), peers_(std::move(peers)), rank_(rank) {
  buddies_ = snapshot_buddies(peers_);
  const auto by_node = processes_by_node(peers_);
  hosts_ = static_cast<int>(by_node.size());
  first_of_host_ = by_node.at(peers_[static_cast<size_t>(rank_)].node).front() == rank_;
}

Result<std::unique_ptr<SnapshotCopies>> SnapshotCopies::open(comm::Bootstrap& bootstrap, comm::CommWorld& world,
                                                             int node, int local_rank) {
  auto all = bootstrap.all_gather("snapshot hosts", std::to_string(node) + " " + std::to_string(local_rank));
  if (!all) return all.status();
  std::vector<SnapshotPeer> peers;
  for (const std::string& s : all.value()) {
    const auto f = split_fields(s, ' ');
    int64_t n = 0, l = 0;
    if (f.size() != 2 || !parse_strict_count(f[0], kMaxSnapshotShards, &n) ||
        !parse_strict_count(f[1], kMaxSnapshotShards, &l))
      return Status::bad_input("a process reported its host as '" + s.substr(0, 64) +
                               "' -- every process of the job must run the same troupe");
    peers.push_back({static_cast<int>(n), static_cast<int>(l)});
  }
  if (static_cast<int>(peers.size()) != world.size())
    return Status::error("the bootstrap and the world disagree on the job's size -- report this");
  auto everyone = world.everyone();
  if (!everyone) return everyone.status();
  return std::unique_ptr<SnapshotCopies>(
      new SnapshotCopies(bootstrap, std::move(everyone).value(), std::move(peers), world.rank()));
}

Result<std::string> SnapshotCopies::my_reads(std::shared_ptr<const RankCoverage> coverage) {
  if (my_reads_) return *my_reads_;
  // Every process's shard contents, once per job (the layout does not change while it runs): the
  // sizes, then the texts ("" from a process without a coverage).
  const std::string mine = coverage ? encode_coverage(coverage->writes) : std::string();
  const int world = static_cast<int>(peers_.size());
  std::vector<uint64_t> sizes(static_cast<size_t>(world));
  uint64_t size = mine.size();
  TROUPE_RETURN_IF_ERROR(comm_->all_gather(&size, sizes.data(), 1, DType::i64)->wait());
  const uint64_t max = max_copy_bytes();
  uint64_t total = 0;
  for (uint64_t n : sizes) {
    if (n > max - total)
      return Status::error("the processes' reports of their snapshot shards add up to more than this host's memory "
                           "-- report this");
    total += n;
  }
  std::string all(static_cast<size_t>(total), '\0');
  const std::vector<size_t> counts(sizes.begin(), sizes.end());
  TROUPE_RETURN_IF_ERROR(comm_->all_gather_v(mine.data(), all.data(), counts, DType::u8)->wait());
  std::vector<ShardCoverage> writes;
  bool everyone = coverage != nullptr;
  size_t at = 0;
  for (int p = 0; p < world; ++p) {
    const std::string_view text(all.data() + at, counts[static_cast<size_t>(p)]);
    at += text.size();
    if (text.empty()) {
      everyone = false;
      continue;
    }
    auto parsed = parse_coverage(text);
    if (!parsed) return parsed.status().with_context(fmt::format("process {}: ", p));
    writes.push_back(std::move(parsed).value());
  }
  std::string list;
  if (!everyone) {
    list = "-";
  } else {
    for (int s : shards_read(coverage->reads, writes)) list += (list.empty() ? "" : ",") + std::to_string(s);
    if (list.empty()) list = ".";
  }
  my_reads_ = list;
  return list;
}

SnapshotCopies::~SnapshotCopies() {
  for (const KeptCopy& k : kept_) ::unlink(k.link.c_str());  // a snapshot's own name stays
}

std::string SnapshotCopies::take_kept_copy(int peer) {
  for (size_t i = 0; i < kept_.size();) {
    struct stat st {};
    if (kept_[i].peer != peer) {
      ++i;
    } else if (::lstat(kept_[i].link.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {  // gone (the folder was cleared)
      kept_.erase(kept_.begin() + static_cast<std::ptrdiff_t>(i));
    } else if (st.st_nlink != 1) {  // still a snapshot's
      ++i;
    } else {
      std::string link = std::move(kept_[i].link);
      kept_.erase(kept_.begin() + static_cast<std::ptrdiff_t>(i));
      return link;
    }
  }
  return "";
}

void SnapshotCopies::keep_copy(const std::string& path, int peer) {
  const fs::path file(path);
  const fs::path recycle = file.parent_path().parent_path() / ".recycle";
  std::error_code ec;
  fs::create_directories(recycle, ec);
  const std::string mine = "copy." + file.filename().string() + "." + std::to_string(::getpid()) + ".";
  if (!swept_) {  // those of processes gone (killed before they could remove them)
    swept_ = true;
    for (const auto& e : fs::directory_iterator(recycle, ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("copy.", 0) == 0 && kept_link_orphaned(name)) fs::remove(e.path(), ec);
    }
  }
  static std::atomic<uint64_t> names{0};
  const std::string link = (recycle / (mine + std::to_string(names.fetch_add(1)))).string();
  if (::link(path.c_str(), link.c_str()) != 0) return;  // not kept: the next copy is received anew
  kept_.push_back({peer, link});
  // At most two of each sender's: the newest snapshot's, and the one received into next.
  if (std::count_if(kept_.begin(), kept_.end(), [&](const KeptCopy& k) { return k.peer == peer; }) > 2) {
    auto oldest = std::find_if(kept_.begin(), kept_.end(), [&](const KeptCopy& k) { return k.peer == peer; });
    ::unlink(oldest->link.c_str());
    kept_.erase(oldest);
  }
}

Result<SnapshotCopies::Exchanged> SnapshotCopies::exchange(const std::string& dir, int64_t iteration,
                                                           std::shared_ptr<const RankCoverage> coverage) {
  auto reads = my_reads(std::move(coverage));
  if (!reads) return reads.status();
  std::vector<Outgoing> out;
  std::vector<Incoming> in;
  const std::string own = shard_file_path(dir, iteration, rank_);
  if (buddy() >= 0) {  // sent from the file's pages
    auto mapped = MappedFileRead::open(own, max_copy_bytes());
    if (!mapped) return mapped.status();
    Outgoing o;
    o.peer = buddy(), o.tag = exchange_tag(iteration, 0), o.mapped = std::move(mapped).value();
    out.push_back(std::move(o));
  }
  // Each copy received straight into the pages of its file (a kept one's when there is one), checked,
  // then committed.
  std::vector<std::optional<MappedFileWrite>> files;
  int in_place = 0;
  for (size_t p = 0; p < buddies_.size(); ++p)
    if (buddies_[p] == rank_) {
      const size_t k = files.size();
      files.emplace_back();
      const int peer = static_cast<int>(p);
      const std::string path = shard_file_path(dir, iteration, peer);
      Incoming i;
      i.peer = peer, i.tag = exchange_tag(iteration, 0);
      i.place = [this, &files, &in_place, k, peer, path](uint64_t bytes) -> Result<uint8_t*> {
        TROUPE_RETURN_IF_ERROR(make_directories(parent_dir(path)));
        if (const std::string old = take_kept_copy(peer); !old.empty()) {
          if (auto file = MappedFileWrite::reuse(path, old, bytes)) {
            files[k] = std::move(file).value();
            ++in_place;
            return files[k]->data();
          }
        }
        auto file = MappedFileWrite::create(path, bytes);
        if (!file) return file.status();
        files[k] = std::move(file).value();
        return files[k]->data();
      };
      in.push_back(std::move(i));
    }
  if (Status st = move_files(*comm_, out, in); !st)
    return st.with_context("copying snapshot " + std::to_string(iteration) + " to the buddy host: ");
  for (size_t k = 0; k < in.size(); ++k) {
    const std::string path = shard_file_path(dir, iteration, in[k].peer);
    auto digest = verify_shard_bytes({reinterpret_cast<const char*>(in[k].data), static_cast<size_t>(in[k].size)},
                                     path + fmt::format(" (as received from process {})", in[k].peer));
    if (!digest) return digest.status();
    TROUPE_RETURN_IF_ERROR(files[k]->commit());
    keep_copy(path, in[k].peer);
  }
  // Every shard's digest, from its writer (the header of its own file).
  auto digest = read_shard_digest(own);
  if (!digest) return digest.status();
  if (!digest->has_value()) return Status::error(own + " has no integrity header -- report this");
  auto all = bootstrap_.all_gather("snapshot digests " + std::to_string(iteration),
                                   fmt::format("{} {} {}", (*digest)->bytes, (*digest)->crc32, reads.value()));
  if (!all) return all.status();
  Exchanged got;
  got.copies_in_place = in_place;
  bool known = true;
  const int world = static_cast<int>(peers_.size());
  for (const std::string& s : all.value()) {
    const auto f = split_fields(s, ' ');
    int64_t bytes = 0, crc = 0;
    std::vector<int> list;
    bool ok = f.size() == 3 && parse_strict_count(f[0], std::numeric_limits<int64_t>::max() / 2, &bytes) &&
              parse_strict_count(f[1], 0xffffffffLL, &crc);
    if (ok && f[2] == "-") {
      known = false;
    } else if (ok && f[2] != ".") {
      for (std::string_view x : split_fields(f[2], ',')) {
        int64_t shard = 0;
        ok = ok && parse_strict_count(x, world - 1, &shard) && (list.empty() || shard > list.back());
        list.push_back(static_cast<int>(shard));
      }
    }
    if (!ok)
      return Status::bad_input("a process reported its snapshot shard's digest as '" + s.substr(0, 64) +
                               "' -- every process of the job must run the same troupe");
    got.digests.push_back({static_cast<uint64_t>(bytes), static_cast<uint32_t>(crc)});
    got.reads.push_back(std::move(list));
  }
  if (!known) got.reads.clear();
  return got;
}

Result<SnapshotCopies::Recovered> SnapshotCopies::recover(const std::string& dir, const SnapshotReport& mine) {
  auto all = bootstrap_.all_gather("snapshot recovery", encode_snapshot_report(mine));
  if (!all) return all.status();
  std::vector<SnapshotReport> reports;
  for (const std::string& s : all.value()) {
    auto r = parse_snapshot_report(s);
    if (!r) return r.status();
    reports.push_back(std::move(r).value());
  }
  RecoveryPlan plan = plan_snapshot_recovery(reports, peers_);
  Recovered got;
  got.iteration = plan.iteration;
  if (plan.iteration < 0) return got;
  // Its metadata.json, for every host's folder and for the shards each rank reads ("reads"): a host
  // fetches those its ranks read, not the whole snapshot.
  std::string text;
  if (rank_ == plan.metadata_from) {
    auto t = read_checkpoint_metadata_text(dir, plan.iteration);
    if (!t) return t.status();
    text = std::move(t).value();
  }
  auto texts = bootstrap_.all_gather("snapshot metadata " + std::to_string(plan.iteration), text);
  if (!texts) return texts.status();
  const std::string& metadata = (*texts)[static_cast<size_t>(plan.metadata_from)];
  auto parsed = parse_checkpoint_metadata(metadata, "the metadata.json of snapshot " + std::to_string(plan.iteration));
  if (!parsed) return parsed.status();
  plan = plan_snapshot_recovery(reports, peers_, parsed->reads);
  std::vector<Outgoing> out;
  std::vector<Incoming> in;
  std::vector<int> into_shard;
  for (const ShardFetch& f : plan.fetches) {
    if (f.from == rank_) {
      auto bytes = read_shard(shard_file_path(dir, plan.iteration, f.shard));
      if (!bytes) return bytes.status();
      Outgoing o;
      o.peer = f.to, o.tag = fetch_tag(f.shard, 0), o.bytes = std::move(bytes).value();
      out.push_back(std::move(o));
    }
    if (f.to == rank_) {
      Incoming i;
      i.peer = f.from, i.tag = fetch_tag(f.shard, 0);
      in.push_back(std::move(i));
      into_shard.push_back(f.shard);
    }
  }
  if (Status st = move_files(*comm_, out, in); !st)
    return st.with_context("fetching the shards of snapshot " + std::to_string(plan.iteration) + " from the other hosts: ");
  for (size_t i = 0; i < in.size(); ++i)
    TROUPE_RETURN_IF_ERROR(write_copy(shard_file_path(dir, plan.iteration, into_shard[i]), in[i].bytes, in[i].peer));
  // The host's folder: the snapshot's metadata.json where it is missing, its latest pointer.
  if (first_of_host_) TROUPE_RETURN_IF_ERROR(install_checkpoint_metadata(dir, plan.iteration, metadata));
  TROUPE_RETURN_IF_ERROR(bootstrap_.barrier("snapshot installed " + std::to_string(plan.iteration)));
  std::map<int, int> fetched_by_host;
  for (const ShardFetch& f : plan.fetches) ++fetched_by_host[peers_[static_cast<size_t>(f.to)].node];
  std::string fetched;
  for (const auto& [node, count] : fetched_by_host)
    fetched += fmt::format("{}{} of {} shards into node {}'s folder", fetched.empty() ? "" : ", ", count, peers_.size(), node);
  const std::string what = plan.by_reads ? "what its ranks read" : "it";
  got.note = fmt::format("the in-memory snapshot of iteration {} is whole over the job's {} hosts; {}", plan.iteration, hosts_,
                         fetched.empty() ? "every host's folder held " + what
                                         : "fetched from the other hosts " + fetched +
                                               (plan.by_reads ? " (the shards its ranks read)" : ""));
  return got;
}

}  // namespace troupe
