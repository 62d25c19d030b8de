#include "apps/cli/launch_options.hpp"

#include <signal.h>

#include <algorithm>
#include <charconv>
#include <cmath>

#include "base/spelling.hpp"

namespace troupe {

namespace {

using Problems = std::vector<std::string>;

// One flag: its spellings (the dash one first), whether it takes a value, torchrun's PET_ variable
// (empty: none), the sentence of the docs table, and what it does to the options. `label` is how
// problems name where the value came from ("--nnodes" or "PET_NNODES").
struct Flag {
  std::vector<std::string> names;
  bool takes_value;
  bool torchrun;  // one of torchrun's (true) or troupe's own
  std::string text;
  std::function<void(LaunchOptions&, const std::string& label, const std::string& value, const HostFacts&,
                     Problems&)>
      apply;
};

std::optional<long long> to_int(const std::string& s) {
  long long v = 0;
  const char* end = s.data() + s.size();
  auto [p, ec] = std::from_chars(s.data(), end, v);
  if (s.empty() || ec != std::errc() || p != end) return std::nullopt;
  return v;
}

std::optional<double> to_seconds(const std::string& s) {
  if (s.empty() || s.size() > 32) return std::nullopt;
  char* end = nullptr;
  const std::string copy = s;
  const double v = std::strtod(copy.c_str(), &end);
  if (end != copy.c_str() + copy.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

void int_in(const std::string& label, const std::string& value, long long lo, long long hi, int* out,
            const std::string& fix, Problems& problems) {
  const auto v = to_int(value);
  if (!v || *v < lo || *v > hi) {
    problems.push_back(label + " " + value + ": " + fix);
    return;
  }
  *out = static_cast<int>(*v);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t at = s.find(sep, start);
    out.push_back(s.substr(start, at == std::string::npos ? std::string::npos : at - start));
    if (at == std::string::npos) return out;
    start = at + 1;
  }
}

// Rendezvous ids travel in the environment, in the join message and in --log-dir's folder names.
bool good_id(const std::string& id) {
  if (id.empty() || id.size() > 128) return false;
  for (unsigned char c : id)
    if (c <= ' ' || c >= 127 || c == '/' || c == '\\') return false;
  return true;
}

// "HOST", "HOST:PORT", "[V6]:PORT", "[V6]" -> host and port (-1 when absent).
bool parse_endpoint(const std::string& text, std::string* host, int* port) {
  std::string h = text, p;
  if (!text.empty() && text[0] == '[') {
    const size_t close = text.find(']');
    if (close == std::string::npos) return false;
    h = text.substr(1, close - 1);
    const std::string rest = text.substr(close + 1);
    if (!rest.empty() && rest[0] != ':') return false;
    if (!rest.empty()) p = rest.substr(1);
  } else if (const size_t colon = text.rfind(':'); colon != std::string::npos) {
    if (text.find(':') != colon) return false;  // a bare IPv6 address: write it in brackets
    h = text.substr(0, colon);
    p = text.substr(colon + 1);
  }
  if (h.empty()) return false;
  *host = h;
  *port = -1;
  if (!p.empty() || text.back() == ':') {
    const auto v = to_int(p);
    if (!v || *v < 0 || *v > 65535) return false;
    *port = static_cast<int>(*v);
  }
  return true;
}

std::string strip_brackets(const std::string& addr) {
  if (addr.size() > 2 && addr.front() == '[' && addr.back() == ']') return addr.substr(1, addr.size() - 2);
  return addr;
}

void apply_rdzv_conf(LaunchOptions& o, const std::string& label, const std::string& value, Problems& problems) {
  // torchrun's keys (torch/distributed/elastic/rendezvous): what troupe's rendezvous does with each.
  static const std::set<std::string> no_effect = {"read_timeout", "close_timeout",
                                                  "keep_alive_interval", "keep_alive_max_attempt",
                                                  "heartbeat", "is_host", "use_libuv", "store_type"};
  for (const std::string& item : split(value, ',')) {
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq), v = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (eq == std::string::npos || key.empty()) {
      problems.push_back(label + " " + value + ": '" + item + "' is not key=value -- write e.g. " + label +
                         " join_timeout=900");
    } else if (key == "join_timeout" || key == "timeout") {
      const auto s = to_seconds(v);
      if (!s || *s <= 0 || *s > 86400) {
        problems.push_back(label + " " + key + "=" + v + ": the rendezvous timeout must be seconds in (0, 86400]");
      } else {
        o.join_timeout_s = *s;
        o.join_timeout_given = true;
      }
    } else if (key == "last_call_timeout") {
      const auto s = to_seconds(v);
      if (!s || *s < 0 || *s > 86400) {
        problems.push_back(label + " last_call_timeout=" + v + ": the last call must be seconds in [0, 86400]");
      } else {
        o.last_call_s = *s;
        o.last_call_given = true;
      }
    } else if (no_effect.count(key) > 0) {
      o.notes.push_back(label + " " + key + "=" + v +
                        ": no effect -- troupe's rendezvous has no such setting (its peers are watched by "
                        "heartbeats, docs/COMM.md)");
    } else if (key == "rank") {
      o.notes.push_back(label + " rank=" + v + ": no effect -- the node's rank is --node-rank");
    } else {
      problems.push_back(label + " " + key + "=" + v +
                         ": not a rendezvous setting troupe knows -- join_timeout sets how long rank 0 waits "
                         "for every rank to join, last_call_timeout how long an elastic round waits for more "
                         "nodes once MIN are there; read_timeout, close_timeout, "
                         "keep_alive_interval, keep_alive_max_attempt, is_host, use_libuv are accepted "
                         "without effect");
    }
  }
}

int signal_of(const std::string& name) {
  static const std::map<std::string, int> known = {{"SIGTERM", SIGTERM}, {"SIGINT", SIGINT},   {"SIGHUP", SIGHUP},
                                                   {"SIGQUIT", SIGQUIT}, {"SIGUSR1", SIGUSR1}, {"SIGUSR2", SIGUSR2}};
  auto it = known.find(name);
  return it == known.end() ? 0 : it->second;
}

const std::vector<Flag>& flags() {
  static const std::vector<Flag> table = {
      {{"--nnodes"}, true, true,
       "implemented: N, or MIN:MAX (elastic: a round runs on the nodes there, at least MIN, the data-parallel size "
       "following them; a lost node is left out -- node 0 too: its standby then hosts the rounds -- one that comes "
       "back joins at the next snapshot)",
       [](LaunchOptions& o, const std::string& label, const std::string& v, const HostFacts&, Problems& p) {
         const auto parts = split(v, ':');
         const auto lo = to_int(parts[0]), hi = parts.size() == 2 ? to_int(parts[1]) : lo;
         if (parts.size() > 2 || !lo || !hi || *lo < 1 || *hi < 1 || *lo > 100000 || *hi > 100000) {
           p.push_back(label + " " + v + ": not a node count -- give N or MIN:MAX (e.g. 2 or 1:4)");
         } else if (*lo > *hi) {
           p.push_back(label + " " + v + ": MIN is above MAX -- give MIN:MAX with MIN <= MAX (e.g. " + label + " " +
                       std::to_string(*hi) + ":" + std::to_string(*lo) + ")");
         } else {
           o.min_nnodes = static_cast<int>(*lo);
           o.nnodes = static_cast<int>(*hi);
         }
       }},
      {{"--nproc-per-node", "--nproc_per_node"}, true, true,
       "implemented: N, auto (the GPUs if any, else the CPUs), cpu (os.cpu_count()), gpu (the visible CUDA "
       "devices; refused when there are none)",
       [](LaunchOptions& o, const std::string& label, const std::string& v, const HostFacts& h, Problems& p) {
         if (v == "cpu" || (v == "auto" && h.gpus == 0)) {
           o.nproc_per_node = std::max(1, h.cpus);
           o.notes.push_back(label + " " + v + ": " + std::to_string(o.nproc_per_node) + " rank(s), the CPUs of this host" +
                             (v == "auto" ? " (no CUDA device is visible)" : ""));
         } else if (v == "gpu" || v == "auto") {
           if (h.gpus == 0) {
             p.push_back(label + " gpu: no CUDA device is visible to this process (" + h.gpu_detail +
                         ") -- give a number of ranks, or cpu / auto");
           } else {
             o.nproc_per_node = h.gpus;
             o.notes.push_back(label + " " + v + ": " + std::to_string(h.gpus) + " rank(s), the visible CUDA devices");
           }
         } else if (v == "xpu") {
           p.push_back(label + " xpu: troupe has no Intel XPU backend -- give a number of ranks, cpu, gpu or auto");
         } else {
           int_in(label, v, 1, 4096, &o.nproc_per_node, "give a number of ranks from 1 to 4096, or auto, cpu, gpu", p);
         }
       }},
      {{"--node-rank", "--node_rank"}, true, true, "implemented: this node's index, 0 .. nnodes-1",
       [](LaunchOptions& o, const std::string& label, const std::string& v, const HostFacts&, Problems& p) {
         int_in(label, v, 0, 99999, &o.node_rank, "give this node's index, 0 .. nnodes-1", p);
         o.node_rank_given = true;
       }},
      {{"--master-addr", "--master_addr"}, true, true,
       "implemented: the host of node 0, where rank 0 hosts troupe's rendezvous (IPv6 in brackets or bare)",
       [](LaunchOptions& o, const std::string& label, const std::string& v, const HostFacts&, Problems& p) {
         if (strip_brackets(v).empty()) p.push_back(label + ": empty -- give the host of node 0");
         o.master_addr = strip_brackets(v);
         o.master_addr_given = true;
       }},
      {{"--master-port", "--master_port"}, true, true,
       "implemented: rank 0's rendezvous port (default: a free port on one node, else 29500)",
       [](LaunchOptions& o, const std::string& label, const std::string& v, const HostFacts&, Problems& p) {
         int_in(label, v, 0, 65535, &o.master_port, "not a TCP port -- use 1..65535 (0: a free one, one node only)", p);
         o.master_port_given = o.master_port != 0;
       }},
      {{"--rdzv-backend", "--rdzv_backend"}, true, true,
       "static and c10d: troupe's own rendezvous (rank 0's actor at the endpoint, TLS keyed by the job token, "
       "fixed membership: each node gives --node-rank); etcd and etcd-v2 refused (no etcd client)",
       [](LaunchOptions& o, const std::string& label, const std::string& v, const HostFacts&, Problems& p) {
         if (v == "static" || v == "c10d") {
           o.rdzv_backend = v;
           o.notes.push_back(label + " " + v +
                             ": troupe's own rendezvous: rank 0 hosts it at the master address and port, TLS keyed "
                             "by the job token, with fixed membership (every node gives --node-rank)");
         } else if (v == "etcd" || v == "etcd-v2") {
           p.push_back(label + " " + v +
                       ": troupe's rendezvous is its own (rank 0 hosts it at MASTER_ADDR:MASTER_PORT) and has no "
                       "etcd client -- use --rdzv-backend c10d (or static) with --rdzv-endpoint <node 0's host>:<port>");
         } else {
           p.push_back(label + " " + v + ": not a rendezvous backend -- use c10d or static");
         }
       }},
      {{"--rdzv-endpoint", "--rdzv_endpoint"}, true, true,
       "implemented: HOST[:PORT] is the master address and port (port default 29400, torchrun's; 0 = a free "
       "port on one node)",
       [](LaunchOptions& o, const std::string& label, const std::string& v, const HostFacts&, Problems& p) {
         std::string host;
         int port = -1;
         if (!parse_endpoint(v, &host, &port)) {
           p.push_back(label + " " + v + ": not HOST[:PORT] -- e.g. node0:29400, or [fd00::1]:29400 for IPv6");
           return;
         }
         if (o.master_addr_given && o.master_addr != host)
           p.push_back(label + " " + v + " and --master-addr " + o.master_addr +
                       " name different hosts -- give one of them");
         o.master_addr = host;
         o.master_addr_given = true;
         o.master_port = port < 0 ? 29400 : port;
         o.master_port_given = o.master_port != 0;
       }},
      {{"--rdzv-id", "--rdzv_id"}, true, true,
       "implemented: the job's id (TORCHELASTIC_RUN_ID); every launcher of a job must give the same one, and "
       "the rendezvous refuses a rank whose id differs, naming both",
       [](LaunchOptions& o, const std::string& label, const std::string& v, const HostFacts&, Problems& p) {
         if (!good_id(v))
           p.push_back(label + " '" + v +
                       "': an id must be 1 to 128 printable characters without spaces or slashes -- e.g. the "
                       "scheduler's job id");
         else
           o.rdzv_id = v;
       }},
      {{"--rdzv-conf", "--rdzv_conf"}, true, true,
       "join_timeout=S (alias timeout) implemented: how long rank 0 waits for every rank to join (600 s); "
       "last_call_timeout=S implemented with --nnodes MIN:MAX: how long a round waits for more nodes once MIN are "
       "there (30 s); torchrun's other keys accepted without effect; unknown keys refused",
       [](LaunchOptions& o, const std::string& label, const std::string& v, const HostFacts&, Problems& p) {
         apply_rdzv_conf(o, label, v, p);
       }},
      {{"--standalone"}, false, true,
       "implemented: one node, rendezvous on a free loopback port, a fresh --rdzv-id; explicit rendezvous "
       "flags are ignored (as torchrun does)",
       [](LaunchOptions& o, const std::string&, const std::string&, const HostFacts&, Problems&) {
         o.standalone = true;
       }},
      {{"--max-restarts", "--max_restarts"}, true, true,
       "implemented: after a failure every rank of the node starts again, up to N times (with troupe's "
       "--in-job-recovery only the failed rank's process, the others rejoin)",
       [](LaunchOptions& o, const std::string& label, const std::string& v, const HostFacts&, Problems& p) {
         int_in(label, v, 0, 1000000, &o.max_restarts, "must be >= 0 (0: stop at the first failure)", p);
       }},
      {{"--monitor-interval", "--monitor_interval"}, true, true,
       "accepted without effect: troupe's launcher sees a rank end at once (SIGCHLD, checked every 0.1 s)",
       [](LaunchOptions& o, const std::string& label, const std::string& v, const HostFacts&, Problems& p) {
         const auto s = to_seconds(v);
         if (!s || *s <= 0)
           p.push_back(label + " " + v + ": must be a positive number of seconds");
         else
           o.notes.push_back(label + " " + v +
                             ": no effect -- troupe's launcher notices a rank's end at once (SIGCHLD, every 0.1 s)");
       }},
      {{"--start-method", "--start_method"}, true, true,
       "spawn, fork, forkserver accepted without effect: every rank is a new process (fork + exec, like spawn)",
       [](LaunchOptions& o, const std::string& label, const std::string& v, const HostFacts&, Problems& p) {
         if (v != "spawn" && v != "fork" && v != "forkserver")
           p.push_back(label + " " + v + ": not a start method -- torchrun's are spawn, fork, forkserver");
         else
           o.notes.push_back(label + " " + v +
                             ": no effect -- troupe starts every rank as a new process (fork + exec, like spawn)");
       }},
      {{"--event-log-handler", "--event_log_handler"}, true, true,
       "null accepted (troupe logs no elastic events); other handlers refused",
       [](LaunchOptions&, const std::string& label, const std::string& v, const HostFacts&, Problems& p) {
         if (v != "null")
           p.push_back(label + " " + v +
                       ": troupe has no torch.distributed.elastic event handlers (its launcher reports each rank's "
                       "end on stderr) -- leave it out");
       }},
      {{"--role"}, true, true, "implemented: ROLE_NAME of every rank (default \"default\")",
       [](LaunchOptions& o, const std::string& label, const std::string& v, const HostFacts&, Problems& p) {
         if (!good_id(v))
           p.push_back(label + " '" + v + "': a role must be 1 to 128 printable characters without spaces or slashes");
         else
           o.role = v;
       }},
      {{"--module", "-m"}, false, true,
       "refused: troupe cannot run Python modules in-process -- write the interpreter: -- python3 -m MODULE",
       [](LaunchOptions&, const std::string& label, const std::string&, const HostFacts&, Problems& p) {
         p.push_back(label +
                     ": troupe cannot run Python modules in-process (it has no Python interpreter) -- write the "
                     "interpreter in the command: troupe launch ... -- python3 -m MODULE ARGS");
       }},
      {{"--no-python", "--no_python"}, false, true,
       "implemented: the command is a program, exec'd as given (which is also what troupe does without it)",
       [](LaunchOptions& o, const std::string&, const std::string&, const HostFacts&, Problems&) {
         o.no_python = true;
       }},
      {{"--run-path", "--run_path"}, false, true,
       "implemented as the interpreter running the script: $PYTHON_EXEC or python3 SCRIPT ARGS (a new "
       "interpreter, not torchrun's own)",
       [](LaunchOptions& o, const std::string&, const std::string&, const HostFacts&, Problems&) {
         o.run_path = true;
       }},
      {{"--log-dir", "--log_dir"}, true, true,
       "implemented: DIR/<rdzv id>_<random>/attempt_<restart>/<local rank>/{stdout.log,stderr.log}, torchrun's "
       "layout",
       [](LaunchOptions& o, const std::string& label, const std::string& v, const HostFacts&, Problems& p) {
         if (v.empty()) p.push_back(label + ": empty -- give a folder for the ranks' log files");
         o.log_dir = v;
       }},
      {{"--redirects", "-r"}, true, true,
       "implemented: 1 stdout, 2 stderr, 3 both to the rank's log file only; per local rank as 0:1,1:2",
       [](LaunchOptions& o, const std::string& label, const std::string& v, const HostFacts&, Problems& p) {
         auto s = parse_std_streams(label, v);
         if (!s) p.push_back(s.status().message());
         else o.redirects = *s;
       }},
      {{"--tee", "-t"}, true, true,
       "implemented: 1 stdout, 2 stderr, 3 both to the rank's log file and the console (lines prefixed "
       "[<role><local rank>]:, torchrun's); per local rank as 0:1,1:2",
       [](LaunchOptions& o, const std::string& label, const std::string& v, const HostFacts&, Problems& p) {
         auto s = parse_std_streams(label, v);
         if (!s) p.push_back(s.status().message());
         else o.tee = *s;
       }},
      {{"--local-ranks-filter", "--local_ranks_filter"}, true, true,
       "implemented: only these local ranks' output reaches the console (log files keep everything)",
       [](LaunchOptions& o, const std::string& label, const std::string& v, const HostFacts&, Problems& p) {
         for (const std::string& item : split(v, ',')) {
           const auto r = to_int(item);
           if (!r || *r < 0 || *r > 4095) {
             p.push_back(label + " " + v + ": must be local ranks separated by commas, e.g. 0,1,2");
             return;
           }
           o.local_ranks_filter.insert(static_cast<int>(*r));
         }
       }},
      {{"--local-addr", "--local_addr"}, true, true,
       "implemented on node 0: rank 0's rendezvous listens there (TROUPE_BIND_ADDR); no effect on other nodes "
       "(their ranks connect from the kernel's source address toward the master)",
       [](LaunchOptions& o, const std::string& label, const std::string& v, const HostFacts&, Problems& p) {
         if (strip_brackets(v).empty()) p.push_back(label + ": empty -- give this node's address");
         o.local_addr = strip_brackets(v);
       }},
      {{"--logs-specs", "--logs_specs"}, true, true,
       "refused: a Python entry point (torchrun.logs_specs) -- use --log-dir, --redirects, --tee",
       [](LaunchOptions&, const std::string& label, const std::string& v, const HostFacts&, Problems& p) {
         p.push_back(label + " " + v +
                     ": troupe cannot load torchrun.logs_specs Python plugins -- its layout is --log-dir with "
                     "--redirects / --tee");
       }},
      {{"--numa-binding", "--numa_binding"}, true, true,
       "refused: troupe does not bind ranks to NUMA nodes -- put numactl in the command",
       [](LaunchOptions&, const std::string& label, const std::string& v, const HostFacts&, Problems& p) {
         p.push_back(label + " " + v +
                     ": troupe does not bind ranks to NUMA nodes -- put numactl in the command, e.g. -- numactl "
                     "--cpunodebind=0 --membind=0 python3 train.py");
       }},
      {{"--signals-to-handle", "--signals_to_handle"}, true, true,
       "implemented: the signals passed on to every rank (troupe's default SIGINT,SIGTERM,SIGHUP; SIGQUIT, "
       "SIGUSR1, SIGUSR2 may be added)",
       [](LaunchOptions& o, const std::string& label, const std::string& v, const HostFacts&, Problems& p) {
         o.signals.clear();
         for (const std::string& name : split(v, ',')) {
           const int s = signal_of(name);
           if (s == 0) {
             p.push_back(label + " " + v + ": '" + name +
                         "' is not a signal troupe passes on -- choose from SIGTERM, SIGINT, SIGHUP, SIGQUIT, "
                         "SIGUSR1, SIGUSR2");
             return;
           }
           if (std::find(o.signals.begin(), o.signals.end(), s) == o.signals.end()) o.signals.push_back(s);
         }
       }},
      {{"--use-env", "--use_env"}, false, true,
       "accepted without effect (torch.distributed.launch's): the ranks always get the environment, as under "
       "torchrun",
       [](LaunchOptions& o, const std::string& label, const std::string&, const HostFacts&, Problems&) {
         o.notes.push_back(label + ": no effect -- every rank gets LOCAL_RANK and the rest in its environment");
       }},
      {{"--prefix-output"}, false, false, "troupe's: prefix every output line with \"[rank N] \"",
       [](LaunchOptions& o, const std::string&, const std::string&, const HostFacts&, Problems&) {
         o.prefix_output = true;
       }},
      {{"--stop-grace"}, true, false,
       "troupe's: seconds between SIGTERM and SIGKILL when stopping ranks (3 after a failure, 60 after a "
       "passed-on signal)",
       [](LaunchOptions& o, const std::string& label, const std::string& v, const HostFacts&, Problems& p) {
         const auto s = to_seconds(v);
         if (!s || *s < 0 || *s > 3600) {
           p.push_back(label + " " + v + ": must be in [0, 3600] seconds");
           return;
         }
         o.stop_grace = *s;
         o.stop_grace_given = true;
       }},
      {{"--spares"}, true, false,
       "troupe's: K nodes beyond --nnodes (--node-rank N .. N+K-1, the same flag on every node) wait to replace a "
       "lost node at once: the next round takes them in without waiting for the last call; with --in-job-recovery "
       "their processes start at once and wait as warm spares, each taking a lost rank's place in the running job "
       "(fewer spare nodes than nodes; the rendezvous moves to a standby host, at --master-port or the port after, "
       "when its host is lost)",
       [](LaunchOptions& o, const std::string& label, const std::string& v, const HostFacts&, Problems& p) {
         int_in(label, v, 0, 1024, &o.spares, "give a number of spare nodes from 0 to 1024", p);
       }},
      {{"--in-job-recovery"}, false, false,
       "troupe's: when a rank's process fails, start that process alone again (up to --max-restarts times); "
       "the others keep running and rejoin the job, which resumes its in-memory snapshot",
       [](LaunchOptions& o, const std::string&, const std::string&, const HostFacts&, Problems&) {
         o.in_job_recovery = true;
       }},
      {{"--new-token"}, false, false, "troupe's: print a fresh job token and exit",
       [](LaunchOptions& o, const std::string&, const std::string&, const HostFacts&, Problems&) {
         o.new_token = true;
       }},
      {{"--help", "-h"}, false, false, "troupe's: this help",
       [](LaunchOptions& o, const std::string&, const std::string&, const HostFacts&, Problems&) { o.help = true; }},
  };
  return table;
}

// torchrun's variable for a flag: PET_ and the dash spelling's name in capitals with underscores.
std::string pet_name(const Flag& f) {
  std::string n = "PET_";
  for (char c : f.names[0].substr(2)) n += c == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return n;
}

// The flag `token` names: exact, or a unique prefix of one flag's spellings (argparse's rule).
const Flag* find_flag(const std::string& token) {
  const Flag* prefix_match = nullptr;
  int prefix_matches = 0;
  for (const Flag& f : flags()) {
    bool prefix = false;
    for (const std::string& n : f.names) {
      if (n == token) return &f;
      prefix = prefix || (token.size() > 2 && token.rfind("--", 0) == 0 && n.rfind(token, 0) == 0);
    }
    if (prefix) {
      prefix_match = &f;
      ++prefix_matches;
    }
  }
  return prefix_matches == 1 ? prefix_match : nullptr;
}

// The nearest long spelling of a flag, named by its dash spelling; "" when none is near.
std::string nearest_flag(const std::string& token) {
  std::vector<std::string> names;
  for (const Flag& f : flags())
    for (const std::string& n : f.names)
      if (n.size() > 2) names.push_back(n);
  const auto near = nearest_spellings(token, names, 1);
  if (near.empty()) return "";
  for (const Flag& f : flags())
    if (std::find(f.names.begin(), f.names.end(), near[0]) != f.names.end()) return f.names[0];
  return near[0];
}

bool is_troupe_word(const std::string& w) {
  return w == "troupe" || (w.size() > 7 && w.compare(w.size() - 7, 7, "/troupe") == 0);
}

}  // namespace

Result<StdStreams> parse_std_streams(const std::string& flag, const std::string& text) {
  const std::string fix = flag + " " + text +
                          ": give 0 (none), 1 (stdout), 2 (stderr) or 3 (both), or one per local rank as "
                          "LOCAL_RANK:VALUE pairs, e.g. 0:1,1:2";
  StdStreams s;
  if (text.size() == 1 && text[0] >= '0' && text[0] <= '3') {
    s.all = text[0] - '0';
    return s;
  }
  for (const std::string& item : split(text, ',')) {
    const size_t colon = item.find(':');
    if (colon == std::string::npos || item.size() != colon + 2 || item[colon + 1] < '0' || item[colon + 1] > '3')
      return Status::bad_input(fix);
    const auto rank = to_int(item.substr(0, colon));
    if (!rank || *rank < 0 || *rank > 4095) return Status::bad_input(fix);
    s.per_rank[static_cast<int>(*rank)] = item[colon + 1] - '0';
  }
  return s;
}

CommandKind command_kind(const LaunchOptions& o, const std::set<std::string>& subcommands) {
  if (o.no_python || o.run_path || o.command.empty()) return CommandKind::program;
  return subcommands.count(o.command.front()) > 0 ? CommandKind::troupe : CommandKind::program;
}

Result<LaunchOptions> parse_launch_args(const std::vector<std::string>& args, const HostFacts& host,
                                        const LaunchEnvLookup& env, const std::set<std::string>& subcommands) {
  LaunchOptions o;
  Problems problems;
  std::set<const Flag*> given;
  // Values are applied in table order, not command-line order, so that cross-flag checks inside
  // handlers (--rdzv-endpoint against --master-addr) see the same state whatever the order.
  std::vector<std::pair<const Flag*, std::pair<std::string, std::string>>> values;  // flag, (label, value)
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& token = args[i];
    if (token == "--") {
      ++i;
      break;
    }
    if (token.size() < 2 || token[0] != '-' || token == "-") break;  // the command's first word
    std::string name = token;
    std::optional<std::string> inline_value;
    if (const size_t eq = token.find('='); token.rfind("--", 0) == 0 && eq != std::string::npos) {
      name = token.substr(0, eq);
      inline_value = token.substr(eq + 1);
    } else if (token.rfind("--", 0) != 0 && token.size() > 2) {  // -r3, -t3
      name = token.substr(0, 2);
      inline_value = token.substr(2);
    }
    const Flag* f = find_flag(name);
    if (f == nullptr) {
      const std::string near = nearest_flag(name);
      problems.push_back(name + ": not a flag of troupe launch" +
                         (near.empty() ? std::string(" -- troupe launch --help lists them") : " -- did you mean " + near + "?"));
      // Skip its value, if the next word looks like one, so that it is not taken for the command.
      if (!inline_value && i + 1 < args.size() && args[i + 1].rfind("-", 0) != 0 && args[i + 1] != "--") ++i;
      continue;
    }
    std::string value;
    if (f->takes_value) {
      if (inline_value) {
        value = *inline_value;
      } else if (i + 1 < args.size() && args[i + 1] != "--" &&
                 (args[i + 1].rfind("-", 0) != 0 || to_seconds(args[i + 1]))) {
        value = args[++i];
      } else {
        problems.push_back(name + ": needs a value");
        continue;
      }
    } else if (inline_value) {
      problems.push_back(name + ": takes no value (it is a switch)");
      continue;
    }
    given.insert(f);
    values.push_back({f, {f->names[0] == name ? name : f->names[0], value}});
  }
  // torchrun's variables for what the command line leaves out.
  for (const Flag& f : flags()) {
    if (!f.torchrun || given.count(&f) > 0 || f.names[0] == "--logs-specs" || f.names[0] == "--numa-binding")
      continue;
    const std::string var = pet_name(f);
    const auto v = env ? env(var) : std::nullopt;
    if (!v) continue;
    if (!f.takes_value) {
      const auto on = to_int(*v);
      if (!on) {
        problems.push_back(var + "=" + *v + " (torchrun's variable for " + f.names[0] + "): must be 1 or 0");
        continue;
      }
      if (*on == 0) continue;
    }
    values.push_back({&f, {var, *v}});
  }
  std::stable_sort(values.begin(), values.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [f, lv] : values) f->apply(o, lv.first, lv.second, host, problems);
  o.command.assign(args.begin() + static_cast<std::ptrdiff_t>(std::min(i, args.size())), args.end());
  auto report = [&]() -> Result<LaunchOptions> {
    if (problems.empty()) return o;
    std::string message = problems.size() == 1
                              ? problems[0]
                              : std::to_string(problems.size()) + " problems with the flags of troupe launch:";
    if (problems.size() > 1)
      for (const std::string& p : problems) message += "\n  - " + p;
    return Status::bad_input(message);
  };
  if (o.help) return o;
  if (o.new_token) return report();

  // "troupe launch -- troupe train ..." reads like torchrun's script argument: the program name goes.
  if (!o.no_python && !o.run_path && !o.command.empty() && is_troupe_word(o.command.front()))
    o.command.erase(o.command.begin());
  if (o.standalone) {
    if (o.nnodes > 1)
      problems.push_back("--standalone with --nnodes " + std::to_string(o.nnodes) +
                         ": --standalone is one node -- leave out --nnodes, or drop --standalone and give "
                         "--rdzv-endpoint for several");
    if (o.master_addr_given || o.master_port_given || !o.rdzv_id.empty())
      o.notes.push_back("--standalone: the rendezvous flags given are ignored, as torchrun does (loopback, a free "
                        "port, a fresh id)");
    o.master_addr = "127.0.0.1";
    o.master_addr_given = false;
    o.master_port_given = false;
    o.rdzv_backend = "c10d";
    o.rdzv_id.clear();  // the launcher makes a fresh one
  }
  if (o.node_rank >= o.nnodes + o.spares)
    problems.push_back("--node-rank " + std::to_string(o.node_rank) + " is outside [0, " +
                       std::to_string(o.nnodes + o.spares) + ") for --nnodes " + std::to_string(o.nnodes) +
                       (o.spares > 0 ? " --spares " + std::to_string(o.spares) : std::string()) +
                       " -- number the nodes 0 .. " + std::to_string(o.nnodes + o.spares - 1));
  if (o.nnodes + o.spares > 1 && !o.master_addr_given)
    problems.push_back("--nnodes " + std::to_string(o.nnodes) +
                       " needs the host of node 0, reachable from every node -- give --master-addr HOST or "
                       "--rdzv-endpoint HOST:PORT");
  if (o.nnodes + o.spares > 1 && o.master_addr_given &&
      (o.master_addr == "localhost" || o.master_addr.rfind("127.", 0) == 0 || o.master_addr == "::1"))
    problems.push_back("--nnodes " + std::to_string(o.nnodes) + " with the master at " + o.master_addr +
                       ", a loopback address: the other nodes cannot reach it -- give the network address or "
                       "name of node 0's host");
  if (o.nnodes + o.spares > 1 && o.master_addr_given && o.master_port == 0)
    problems.push_back("port 0 (a free port) works on one node only: with --nnodes " + std::to_string(o.nnodes) +
                       " every node must be told the same port -- give one, e.g. 29500");
  if (o.rounds()) {
    const std::string range = o.elastic() ? "--nnodes " + std::to_string(o.min_nnodes) + ":" + std::to_string(o.nnodes)
                                          : "--spares " + std::to_string(o.spares);
    if (!o.node_rank_given)
      problems.push_back(range + " needs each node's --node-rank (0 .. " + std::to_string(o.nnodes + o.spares - 1) +
                         ", node 0 at --master-addr hosts the rounds; the others are numbered within each round)");
    if (o.master_port >= 65535)
      problems.push_back(range + ": the ranks meet at the master's port + 1 -- give a --master-port below 65535");
    if (!o.command.empty() && o.command.front() == "train" && command_kind(o, subcommands) == CommandKind::troupe) {
      auto given = [&](const std::string& flag) {
        return std::any_of(o.command.begin(), o.command.end(),
                           [&](const std::string& a) { return a == flag || a.rfind(flag + "=", 0) == 0; });
      };
      if (given("--data-parallel-size") && o.elastic())
        problems.push_back(range + " with train --data-parallel-size: the data-parallel size follows the nodes of "
                           "each round -- leave it out (troupe derives it from the world, as Megatron does)");
      if (!given("--global-batch-size") && o.elastic())
        problems.push_back(range + " with train and no --global-batch-size: the batch would follow the nodes of "
                           "each round -- give --global-batch-size (kept by more or fewer accumulation steps)");
    }
  }
  if (o.in_job_recovery && o.max_restarts < 1)
    problems.push_back("--in-job-recovery needs --max-restarts N (N >= 1): how often a failed process is started "
                       "again and the others rejoin");
  if (o.in_job_recovery && o.elastic())
    problems.push_back("--in-job-recovery with --nnodes MIN:MAX: rounds start every node's ranks anew; in-job "
                       "recovery keeps a fixed membership -- choose one (--spares K works with either)");
  if (o.warm_spares()) {
    if (!o.node_rank_given)
      problems.push_back("--spares " + std::to_string(o.spares) + " needs each node's --node-rank (0 .. " +
                         std::to_string(o.nnodes + o.spares - 1) + ": the spare nodes are " +
                         std::to_string(o.nnodes) + " .. " + std::to_string(o.nnodes + o.spares - 1) + ")");
    if (o.command.empty() || o.command.front() != "train" || command_kind(o, subcommands) != CommandKind::troupe)
      problems.push_back("--in-job-recovery --spares: the warm spares are troupe train processes -- launch "
                         "`troupe train ...`, or leave out --spares");
    // Both sides of a network partition can fill every place (and train on apart) only when the
    // spares are as many as the nodes (docs/RESILIENCE.md, "The rendezvous moves").
    if (o.nnodes >= 2 && o.spares >= o.nnodes)
      problems.push_back("--in-job-recovery --spares " + std::to_string(o.spares) + " with --nnodes " +
                         std::to_string(o.nnodes) + ": with as many spare nodes as nodes, the two halves of a "
                         "network partition could each fill every rank's place and both train on -- give at most " +
                         std::to_string(o.nnodes - 1) + " spare node(s)");
  }
  if (!o.elastic() && o.last_call_given) {
    o.notes.push_back("--rdzv-conf last_call_timeout: no effect without --nnodes MIN:MAX (a fixed membership)");
  }
  if (o.nnodes > 1 && o.rdzv_backend == "c10d" && !o.node_rank_given)
    problems.push_back("--rdzv-backend c10d with --nnodes " + std::to_string(o.nnodes) +
                       " and no --node-rank: troupe's rendezvous does not hand out node ranks as torchrun's c10d "
                       "does (its membership is fixed) -- give each node's launcher its --node-rank 0 .. " +
                       std::to_string(o.nnodes - 1));
  if (o.command.empty()) {
    problems.push_back(
        "no command to run -- e.g. troupe launch --nproc-per-node 4 -- train ..., or -- python3 script.py");
  } else if (o.run_path) {
    if (o.command.front().empty() || o.command.front()[0] == '-')
      problems.push_back("--run-path: the command's first word must be the Python script to run");
  } else if (o.no_python && is_troupe_word(o.command.front())) {
    // A troupe binary as a program: it runs as given.
  } else if (command_kind(o, subcommands) == CommandKind::program && o.command.front().find('/') == std::string::npos &&
             host.which && host.which(o.command.front()).empty()) {
    std::string p = "'" + o.command.front() + "' is neither a troupe subcommand nor a program on PATH";
    const std::string& w = o.command.front();
    if (w.size() > 3 && w.compare(w.size() - 3, 3, ".py") == 0)
      p += " -- torchrun would run it with python; troupe runs the command as given: write -- python3 " + w;
    else
      p += " -- give a troupe subcommand (train, comm-check, ...), a program's path, or a program on PATH";
    problems.push_back(p);
  }
  return report();
}

std::string launch_usage() {
  std::string s =
      "troupe launch: start the ranks of a job on this node, with torchrun's flags\n"
      "  troupe launch [FLAGS] [--] COMMAND [ARGS...]\n"
      "COMMAND is a troupe subcommand (train, comm-check, ...) or any program, run as given with torchrun's\n"
      "environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...): -- python3 train.py ...\n"
      "Flags (dash or underscore spellings; PET_<NAME> variables as torchrun reads them):\n";
  for (const Flag& f : flags()) {
    std::string names;
    for (const std::string& n : f.names) names += (names.empty() ? "" : ", ") + n;
    if (f.takes_value) names += " V";
    s += "  " + names + "\n      " + f.text + "\n";
  }
  return s;
}

std::vector<LaunchFlagRow> launch_flag_table() {
  std::vector<LaunchFlagRow> rows;
  for (const Flag& f : flags())
    if (f.torchrun) rows.push_back({f.names[0], f.text});
  return rows;
}

}  // namespace troupe
