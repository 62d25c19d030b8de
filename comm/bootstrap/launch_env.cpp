#include "comm/bootstrap/launch_env.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <limits>

namespace troupe::comm {

namespace {

constexpr const char* kNewTokenHint = "export TROUPE_JOB_TOKEN=$(troupe launch --new-token)";

Result<long long> parse_int(const std::string& name, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || errno != 0 || end != text.c_str() + text.size() ||
      v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max())
    return Status::error(name + "='" + text + "' is not an integer -- fix or unset " + name);
  return v;
}

// The first of `names` that is set, as an int; nullopt when none is.
Result<std::optional<int>> read_int(const EnvLookup& env,
                                    std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (auto text = env(name)) {
      auto v = parse_int(name, *text);
      if (!v) return v.status();
      return std::optional<int>(static_cast<int>(*v));
    }
  }
  return std::optional<int>();
}

std::optional<std::string> read_str(const EnvLookup& env,
                                    std::initializer_list<const char*> names) {
  for (const char* name : names)
    if (auto v = env(name)) return v;
  return std::nullopt;
}

// FNV-1a: a stable hash so every rank derives the same port from the same job id.
uint64_t fnv1a(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

int port_from_job_id(const std::string& id) {
  bool digits = !id.empty() && id.size() < 19;
  for (char c : id) digits = digits && c >= '0' && c <= '9';
  const uint64_t n = digits ? std::stoull(id) : fnv1a(id);
  return 20000 + static_cast<int>(n % 10000);
}

// The first host of Open MPI 4's HNP URI "<jobid>.<vpid>;tcp://10.0.0.1,10.1.0.1:40000;tcp6://...".
std::optional<std::string> host_from_hnp_uri(const std::string& uri) {
  const auto at = uri.find("tcp://");
  if (at == std::string::npos) return std::nullopt;
  const auto begin = at + 6;
  const auto end = uri.find_first_of(",:;", begin);
  std::string host = uri.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
  if (host.empty()) return std::nullopt;
  return host;
}

// Open MPI 5 (PRRTE) names the job "prterun-<mpirun's host>-<pid>@<n>".
std::optional<std::string> host_from_pmix_namespace(const std::string& ns) {
  const std::string prefix = "prterun-";
  if (ns.rfind(prefix, 0) != 0) return std::nullopt;
  const auto at = ns.find('@');
  const auto dash = ns.rfind('-', at);
  if (at == std::string::npos || dash == std::string::npos || dash <= prefix.size())
    return std::nullopt;
  return ns.substr(prefix.size(), dash - prefix.size());
}

Status check_ranks(const LaunchEnv& e, const std::string& vars) {
  if (e.world_size < 1)
    return Status::error("the world size is " + std::to_string(e.world_size) + " (from " + vars +
                         ") -- it must be at least 1");
  if (e.rank < 0 || e.rank >= e.world_size)
    return Status::error("rank " + std::to_string(e.rank) + " is outside the world of " +
                         std::to_string(e.world_size) + " (from " + vars +
                         ") -- the rank must be in [0, " + std::to_string(e.world_size) + ")");
  if (e.local_world_size < 1 || e.local_rank < 0 || e.local_rank >= e.local_world_size ||
      e.local_world_size > e.world_size)
    return Status::error("local rank " + std::to_string(e.local_rank) + " of " +
                         std::to_string(e.local_world_size) + " per node does not fit a world of " +
                         std::to_string(e.world_size) + " (from " + vars +
                         ") -- check the launcher's tasks-per-node settings");
  if (e.master_port < 1 || e.master_port > 65535)
    return Status::error("master port " + std::to_string(e.master_port) + " (from " + vars +
                         ") is not a TCP port -- use one in [1, 65535]");
  if (e.master_addr.empty())
    return Status::error("the master address is empty (from " + vars + ") -- set MASTER_ADDR");
  return Status::ok();
}

std::string starter_name(const std::string& source) {
  if (source == "torchrun env") return "torchrun (RANK / WORLD_SIZE)";
  if (source == "SLURM") return "srun (SLURM_PROCID / SLURM_NTASKS)";
  if (source == "Open MPI") return "mpirun (OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE)";
  return source;
}

// Fills the token; multi-process jobs must bring one, `fix` says how for this starter.
Status resolve_token(const EnvLookup& env, LaunchEnv& e, const std::string& fix) {
  if (auto token = env("TROUPE_JOB_TOKEN")) {
    TROUPE_RETURN_IF_ERROR(validate_job_token(*token, "TROUPE_JOB_TOKEN"));
    e.token = *token;
    return Status::ok();
  }
  if (e.world_size > 1)
    return Status::error("this is rank " + std::to_string(e.rank) + " of a " +
                         std::to_string(e.world_size) + "-process job started by " +
                         starter_name(e.source) +
                         " but TROUPE_JOB_TOKEN is not set: every job needs "
                         "a secret that keys its ranks' connections to the rendezvous -- " +
                         fix);
  auto token = generate_job_token();
  if (!token) return token.status();
  e.token = *token;
  return Status::ok();
}

// TROUPE_MASTER_* / MASTER_* override what a scheduler's environment gives.
Status apply_master_overrides(const EnvLookup& env, LaunchEnv& e) {
  if (auto addr = read_str(env, {"TROUPE_MASTER_ADDR", "MASTER_ADDR"})) e.master_addr = *addr;
  auto port = read_int(env, {"TROUPE_MASTER_PORT", "MASTER_PORT"});
  if (!port) return port.status();
  if (*port) e.master_port = **port;
  return Status::ok();
}

Result<LaunchEnv> from_torchrun_style(const EnvLookup& env, bool troupe) {
  LaunchEnv e;
  e.source = troupe ? "troupe launch" : "torchrun env";
  const std::string vars = troupe ? "TROUPE_RANK / TROUPE_WORLD_SIZE" : "RANK / WORLD_SIZE";
  auto rank = read_int(env, {"TROUPE_RANK", "RANK"});
  auto world = read_int(env, {"TROUPE_WORLD_SIZE", "WORLD_SIZE"});
  auto local_rank = read_int(env, {"TROUPE_LOCAL_RANK", "LOCAL_RANK"});
  auto local_world = read_int(env, {"TROUPE_LOCAL_WORLD_SIZE", "LOCAL_WORLD_SIZE"});
  for (auto* r : {&rank, &world, &local_rank, &local_world})
    if (!*r) return r->status();
  if (!*world)
    return Status::error(std::string(troupe ? "TROUPE_RANK" : "RANK") + " is set but " +
                         (troupe ? "TROUPE_WORLD_SIZE" : "WORLD_SIZE") +
                         " is not -- set both (troupe launch and torchrun set every variable)");
  e.rank = **rank;
  e.world_size = **world;
  // A warm spare of troupe launch (TROUPE_SPARE=1) has no rank until the rendezvous gives it one.
  e.spare = troupe && env("TROUPE_SPARE").value_or("") == "1";
  if (e.spare && e.rank != -1)
    return Status::error("TROUPE_SPARE=1 with TROUPE_RANK=" + std::to_string(e.rank) +
                         ": a spare has no rank until the job gives it one -- troupe launch sets TROUPE_RANK=-1");
  // Without local variables assume one node, as torchrun's single-node default does.
  e.local_rank = local_rank->value_or(e.rank);
  e.local_world_size = local_world->value_or(e.world_size);
  TROUPE_RETURN_IF_ERROR(apply_master_overrides(env, e));
  if (e.world_size > 1 && !read_str(env, {"TROUPE_MASTER_ADDR", "MASTER_ADDR"}) &&
      e.local_world_size != e.world_size)
    return Status::error(
        "MASTER_ADDR is not set for a job spanning several nodes -- set MASTER_ADDR to the host "
        "of rank 0 on every node");
  {
    LaunchEnv checked = e;
    if (e.spare) checked.rank = 0;  // checked as the first rank; the rendezvous gives the real one
    TROUPE_RETURN_IF_ERROR(check_ranks(checked, vars));
  }
  const std::string fix =
      troupe ? "start the ranks with troupe launch, which sets it"
             : std::string(kNewTokenHint) +
                   " before torchrun, the same value on every node (or start with troupe launch)";
  TROUPE_RETURN_IF_ERROR(resolve_token(env, e, fix));
  return e;
}

Result<LaunchEnv> from_slurm(const EnvLookup& env) {
  LaunchEnv e;
  e.source = "SLURM";
  auto rank = read_int(env, {"SLURM_PROCID"});
  auto world = read_int(env, {"SLURM_NTASKS", "SLURM_NPROCS"});
  auto local_rank = read_int(env, {"SLURM_LOCALID"});
  auto per_node = read_int(env, {"SLURM_NTASKS_PER_NODE"});
  auto node_id = read_int(env, {"SLURM_NODEID"});
  for (auto* r : {&rank, &world, &local_rank, &per_node, &node_id})
    if (!*r) return r->status();
  if (!*world)
    return Status::error(
        "SLURM_PROCID is set but SLURM_NTASKS is not -- start the ranks with srun --ntasks N "
        "(or sbatch --ntasks N)");
  e.rank = **rank;
  e.world_size = **world;
  e.local_rank = local_rank->value_or(0);
  if (*per_node) {
    e.local_world_size = **per_node;
  } else if (auto spec = env("SLURM_STEP_TASKS_PER_NODE") ? env("SLURM_STEP_TASKS_PER_NODE")
                                                          : env("SLURM_TASKS_PER_NODE")) {
    auto counts = expand_tasks_per_node(*spec);
    if (!counts) return counts.status().with_context("SLURM_TASKS_PER_NODE: ");
    const int node = node_id->value_or(0);
    if (node < 0 || node >= static_cast<int>(counts->size()))
      return Status::error("SLURM_NODEID=" + std::to_string(node) +
                           " has no entry in SLURM_TASKS_PER_NODE='" + *spec +
                           "' -- set SLURM_NTASKS_PER_NODE");
    e.local_world_size = (*counts)[node];
  } else {
    e.local_world_size = e.world_size;
  }
  if (auto nodes = read_str(env, {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"})) {
    auto hosts = expand_hostlist(*nodes);
    if (!hosts) return hosts.status().with_context("SLURM_JOB_NODELIST: ");
    e.master_addr = hosts->front();
  } else if (e.local_world_size != e.world_size) {
    return Status::error(
        "SLURM_JOB_NODELIST is not set, so rank 0's host is unknown -- set MASTER_ADDR");
  }
  if (auto job = env("SLURM_JOB_ID")) e.master_port = port_from_job_id(*job);
  TROUPE_RETURN_IF_ERROR(apply_master_overrides(env, e));
  TROUPE_RETURN_IF_ERROR(check_ranks(e, "SLURM_PROCID / SLURM_NTASKS"));
  TROUPE_RETURN_IF_ERROR(
      resolve_token(env, e,
                    std::string(kNewTokenHint) +
                        " in the batch script before srun (srun passes it to every task)"));
  return e;
}

Result<LaunchEnv> from_open_mpi(const EnvLookup& env) {
  LaunchEnv e;
  e.source = "Open MPI";
  auto rank = read_int(env, {"OMPI_COMM_WORLD_RANK"});
  auto world = read_int(env, {"OMPI_COMM_WORLD_SIZE"});
  auto local_rank = read_int(env, {"OMPI_COMM_WORLD_LOCAL_RANK"});
  auto local_world = read_int(env, {"OMPI_COMM_WORLD_LOCAL_SIZE"});
  for (auto* r : {&rank, &world, &local_rank, &local_world})
    if (!*r) return r->status();
  if (!*world)
    return Status::error(
        "OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is not -- start with mpirun");
  e.rank = **rank;
  e.world_size = **world;
  e.local_rank = local_rank->value_or(0);
  e.local_world_size = local_world->value_or(e.world_size);
  const auto hnp = env("OMPI_MCA_orte_hnp_uri");
  const auto ns = env("PMIX_NAMESPACE");
  if (e.local_world_size == e.world_size) {
    e.master_addr = "127.0.0.1";
  } else if (auto host = hnp ? host_from_hnp_uri(*hnp) : std::nullopt) {
    e.master_addr = *host;
  } else if (auto host2 = ns ? host_from_pmix_namespace(*ns) : std::nullopt) {
    e.master_addr = *host2;
  } else if (!read_str(env, {"TROUPE_MASTER_ADDR", "MASTER_ADDR"})) {
    return Status::error(
        "cannot tell which host runs rank 0 of this multi-node mpirun job -- pass "
        "mpirun -x MASTER_ADDR=<host of rank 0>");
  }
  if (auto job = read_str(env, {"OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE"})) {
    e.master_port = port_from_job_id(*job);
  } else if (hnp) {
    e.master_port = port_from_job_id(hnp->substr(0, hnp->find(';')));
  }
  TROUPE_RETURN_IF_ERROR(apply_master_overrides(env, e));
  TROUPE_RETURN_IF_ERROR(check_ranks(e, "OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE"));
  TROUPE_RETURN_IF_ERROR(resolve_token(
      env, e, std::string(kNewTokenHint) + " and pass it on: mpirun -x TROUPE_JOB_TOKEN"));
  return e;
}

}  // namespace

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr || *v == '\0') return std::nullopt;
    return std::string(v);
  };
}

EnvLookup map_env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end() || it->second.empty()) return std::nullopt;
    return it->second;
  };
}

namespace {

Result<LaunchEnv> detect_source(const EnvLookup& env) {
  if (env("TROUPE_RANK")) return from_torchrun_style(env, true);
  if (env("RANK")) return from_torchrun_style(env, false);
  if (env("SLURM_PROCID")) return from_slurm(env);
  if (env("OMPI_COMM_WORLD_RANK")) return from_open_mpi(env);
  LaunchEnv e;
  auto token = generate_job_token();
  if (!token) return token.status();
  e.token = *token;
  return e;
}

}  // namespace

Result<LaunchEnv> detect_launch_env(const EnvLookup& env) {
  auto e = detect_source(env);
  if (!e) return e;
  e->rdzv_id = env("TROUPE_RDZV_ID").value_or("");
  const bool slurm = e->source == "SLURM";
  const bool torchrun = e->source == "troupe launch" || e->source == "torchrun env";
  auto node = slurm || torchrun ? read_int(env, {slurm ? "SLURM_NODEID" : "GROUP_RANK"})
                                : Result<std::optional<int>>(std::optional<int>());
  if (!node) return node.status();
  e->node_rank = node->value_or((e->rank - e->local_rank) / std::max(1, e->local_world_size));
  // A spare node's index follows the job's nodes (--nnodes N --spares K: N .. N+K-1).
  if (e->node_rank < 0 || (e->node_rank >= e->world_size && !e->spare))
    return Status::error(std::string(slurm ? "SLURM_NODEID" : "GROUP_RANK") + "=" + std::to_string(e->node_rank) +
                         " is not a node of a job of " + std::to_string(e->world_size) +
                         " rank(s) -- unset it or give the node's index (0 for the first node)");
  return e;
}

Result<std::vector<std::string>> expand_hostlist(std::string_view list) {
  constexpr size_t kMaxHosts = 1 << 20;
  auto bad = [&](const std::string& why) {
    return Status::error("cannot read the hostlist '" + std::string(list) + "': " + why +
                         " -- expected names like node[01-04,07],gpu-a1");
  };
  std::vector<std::string> hosts;
  size_t pos = 0;
  while (pos < list.size()) {
    // One item: up to the next comma outside brackets.
    size_t end = pos;
    int depth = 0;
    for (; end < list.size(); ++end) {
      if (list[end] == '[') ++depth;
      if (list[end] == ']') --depth;
      if (depth < 0) return bad("unbalanced ']'");
      if (list[end] == ',' && depth == 0) break;
    }
    if (depth != 0) return bad("unclosed '['");
    const std::string_view item = list.substr(pos, end - pos);
    pos = end + 1;
    if (item.empty()) continue;
    std::vector<std::string> names{""};
    size_t i = 0;
    while (i < item.size()) {
      if (item[i] != '[') {
        const size_t next = std::min(item.find('[', i), item.size());
        for (auto& n : names) n += item.substr(i, next - i);
        i = next;
        continue;
      }
      const size_t close = item.find(']', i);
      const std::string_view ranges = item.substr(i + 1, close - i - 1);
      i = close + 1;
      std::vector<std::string> parts;
      size_t r = 0;
      while (r <= ranges.size()) {
        const size_t comma = std::min(ranges.find(',', r), ranges.size());
        const std::string_view range = ranges.substr(r, comma - r);
        r = comma + 1;
        const size_t dash = range.find('-');
        const std::string_view lo = range.substr(0, dash);
        const std::string_view hi = dash == std::string_view::npos ? lo : range.substr(dash + 1);
        auto digits = [](std::string_view s) {
          if (s.empty() || s.size() > 9) return false;
          for (char c : s)
            if (c < '0' || c > '9') return false;
          return true;
        };
        if (!digits(lo) || !digits(hi))
          return bad("'" + std::string(range) + "' is not a number or a range a-b");
        const int a = std::stoi(std::string(lo)), b = std::stoi(std::string(hi));
        if (a > b) return bad("the range '" + std::string(range) + "' runs backwards");
        if (static_cast<size_t>(b - a) >= kMaxHosts)
          return bad("the range '" + std::string(range) + "' is too long");
        for (int v = a; v <= b; ++v) {
          std::string s = std::to_string(v);
          if (s.size() < lo.size()) s.insert(0, lo.size() - s.size(), '0');
          parts.push_back(std::move(s));
        }
      }
      std::vector<std::string> product;
      if (names.size() * parts.size() > kMaxHosts) return bad("it names too many hosts");
      for (const auto& n : names)
        for (const auto& p : parts) product.push_back(n + p);
      names = std::move(product);
    }
    if (hosts.size() + names.size() > kMaxHosts) return bad("it names too many hosts");
    hosts.insert(hosts.end(), names.begin(), names.end());
  }
  if (hosts.empty()) return bad("it names no host");
  return hosts;
}

Result<std::vector<int>> expand_tasks_per_node(std::string_view spec) {
  auto bad = [&] {
    return Status::error("cannot read the tasks-per-node list '" + std::string(spec) +
                         "' -- expected counts like 4(x2),2");
  };
  std::vector<int> counts;
  size_t pos = 0;
  while (pos < spec.size()) {
    size_t end = std::min(spec.find(',', pos), spec.size());
    const std::string item(spec.substr(pos, end - pos));
    pos = end + 1;
    int count = 0, times = 1;
    char tail = 0;
    if (std::sscanf(item.c_str(), "%d(x%d)%c", &count, &times, &tail) == 2 ||
        (std::sscanf(item.c_str(), "%d%c", &count, &tail) == 1 &&
         item.find('(') == std::string::npos)) {
      if (count < 1 || times < 1 || times > (1 << 20)) return bad();
      counts.insert(counts.end(), times, count);
    } else {
      return bad();
    }
  }
  if (counts.empty()) return bad();
  return counts;
}

Result<std::string> generate_job_token() {
  unsigned char bytes[32];
  FILE* f = std::fopen("/dev/urandom", "rb");
  const bool ok = f != nullptr && std::fread(bytes, 1, sizeof bytes, f) == sizeof bytes;
  if (f != nullptr) std::fclose(f);
  if (!ok)
    return Status::error(
        "cannot read 32 random bytes from /dev/urandom for the job token -- set TROUPE_JOB_TOKEN "
        "yourself (16 or more letters and digits)");
  static const char* hex = "0123456789abcdef";
  std::string token;
  for (unsigned char b : bytes) {
    token += hex[b >> 4];
    token += hex[b & 15];
  }
  return token;
}

Status validate_job_token(std::string_view token, std::string_view variable) {
  bool ok = token.size() >= 16 && token.size() <= 256;
  for (char c : token)
    ok = ok && ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                c == '_' || c == '-');
  if (ok) return Status::ok();
  return Status::error(std::string(variable) +
                       " must be 16 to 256 letters, digits, '-' or '_' (it has " +
                       std::to_string(token.size()) + " characters) -- " + kNewTokenHint);
}

bool constant_time_equal(std::string_view a, std::string_view b) {
  // Every byte of the longer string is visited whatever the contents, so the time depends on the
  // lengths only.
  const size_t n = std::max(a.size(), b.size());
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned>(x ^ y);
  }
  // Through a volatile so the compiler cannot turn the loop into an early-exit compare.
  volatile unsigned result = diff;
  return result == 0;
}

std::string describe_launch(const LaunchEnv& e) {
  return (e.spare ? std::string("a spare of ") : "rank " + std::to_string(e.rank) + "/") + std::to_string(e.world_size) + " (local " +
         std::to_string(e.local_rank) + "/" + std::to_string(e.local_world_size) + "), master " +
         e.master_addr + ":" + std::to_string(e.master_port) + ", from " + e.source;
}

}  // namespace troupe::comm
