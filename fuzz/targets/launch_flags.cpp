// The `troupe launch` command line (apps/cli/launch_options.hpp, torchrun's flags): one argument per
// line of the input. An optional first line "host=C,G" sets the host's CPUs (1-512) and visible GPUs
// (0-16) for --nproc-per-node auto|cpu|gpu; an optional line "PET_NAME=value" before the arguments
// sets one of torchrun's variables. Checked beyond "no crash": what is accepted is a launch troupe
// can run (sizes in range, a node rank inside the nodes, a command), and its core values written
// back as flags read back the same.
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "apps/cli/launch_options.hpp"
#include "fuzz/fuzz_targets.hpp"
#include "troupe/check.hpp"

namespace troupe::fuzz {
namespace {

const std::set<std::string> kSubcommands = {"train", "comm-check", "eval", "preprocess", "ckpt", "bench",
                                            "info", "plot", "inspect", "launch"};

std::vector<std::string> lines_of(std::string_view text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size() && out.size() < 256) {
    const size_t end = std::min(text.find('\n', start), text.size());
    out.emplace_back(text.substr(start, end - start));
    start = end + 1;
  }
  if (!out.empty() && out.back().empty()) out.pop_back();
  return out;
}

}  // namespace

Status launch_flags(const uint8_t* data, size_t size) {
  std::vector<std::string> args = lines_of(std::string_view(reinterpret_cast<const char*>(data), size));
  HostFacts host;
  host.cpus = 4;
  host.gpu_detail = "fuzz";
  host.which = [](const std::string& name) { return name.size() % 2 == 0 ? "/bin/" + name : ""; };
  if (!args.empty() && args[0].rfind("host=", 0) == 0) {
    unsigned c = 0, g = 0;
    if (std::sscanf(args[0].c_str(), "host=%u,%u", &c, &g) != 2 || c < 1 || c > 512 || g > 16)
      return Status::error("host= needs CPUs 1-512 and GPUs 0-16");
    host.cpus = static_cast<int>(c);
    host.gpus = static_cast<int>(g);
    args.erase(args.begin());
  }
  std::map<std::string, std::string> vars;
  if (!args.empty() && args[0].rfind("PET_", 0) == 0 && args[0].find('=') != std::string::npos) {
    vars[args[0].substr(0, args[0].find('='))] = args[0].substr(args[0].find('=') + 1);
    args.erase(args.begin());
  }
  const LaunchEnvLookup env = [&](const std::string& n) -> std::optional<std::string> {
    auto it = vars.find(n);
    if (it == vars.end() || it->second.empty()) return std::nullopt;
    return it->second;
  };
  auto o = parse_launch_args(args, host, env, kSubcommands);
  if (!o) {
    TROUPE_CHECK(o.status().is_bad_input() && !o.status().message().empty(), "a refusal must be bad input with a message");
    return o.status();
  }
  if (o->help || o->new_token) return Status::ok();
  TROUPE_CHECK(o->nproc_per_node >= 1 && o->nproc_per_node <= 4096, "nproc out of range");
  TROUPE_CHECK(o->nnodes >= 1 && o->node_rank >= 0 && o->node_rank < o->nnodes, "node rank outside the nodes");
  TROUPE_CHECK(o->master_port >= 0 && o->master_port <= 65535, "not a port");
  TROUPE_CHECK(!o->command.empty(), "accepted without a command");
  TROUPE_CHECK(o->nnodes == 1 || o->master_addr_given, "several nodes without a master");
  // The core values, written back as flags, read back the same.
  std::vector<std::string> again = {"--nnodes",       std::to_string(o->nnodes),
                                    "--node-rank",    std::to_string(o->node_rank),
                                    "--nproc-per-node", std::to_string(o->nproc_per_node),
                                    "--max-restarts", std::to_string(o->max_restarts),
                                    "--role=" + o->role};
  // Strings as --flag=value: a value that starts with '-' (an endpoint "-host:port" is accepted)
  // would read as a flag after a space, on any command line.
  if (o->master_addr_given) again.push_back("--master-addr=" + o->master_addr);
  again.insert(again.end(), {"--master-port", std::to_string(o->master_port)});
  if (!o->rdzv_id.empty()) again.push_back("--rdzv-id=" + o->rdzv_id);
  if (o->no_python) again.push_back("--no-python");
  if (o->run_path) again.push_back("--run-path");
  again.push_back("--");
  if (!o->no_python && !o->run_path) again.push_back("troupe");  // dropped again, once
  again.insert(again.end(), o->command.begin(), o->command.end());
  auto back = parse_launch_args(again, host, [](const std::string&) { return std::optional<std::string>(); }, kSubcommands);
  TROUPE_CHECK(bool(back), "accepted flags written back are refused");
  TROUPE_CHECK(back->nnodes == o->nnodes && back->node_rank == o->node_rank &&
                   back->nproc_per_node == o->nproc_per_node && back->master_addr == o->master_addr &&
                   back->master_port == o->master_port && back->rdzv_id == o->rdzv_id && back->role == o->role &&
                   back->max_restarts == o->max_restarts && back->command == o->command,
               "accepted flags written back read back otherwise");
  return Status::ok();
}

}  // namespace troupe::fuzz
