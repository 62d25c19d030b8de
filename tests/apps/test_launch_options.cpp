// `troupe launch` flags (apps/cli/launch_options.hpp): torchrun's grammar and meanings, checked on
// random command lines against the values they were written from, and every refusal at once.
#include <algorithm>
#include <catch2/catch.hpp>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "apps/cli/launch_options.hpp"
#include "tests/test_util.hpp"

namespace troupe {
namespace {

using Catch::Contains;

const std::set<std::string> kSubcommands = {"train", "comm-check", "eval", "launch"};

HostFacts host(int cpus = 8, int gpus = 0) {
  HostFacts h;
  h.cpus = cpus;
  h.gpus = gpus;
  h.gpu_detail = "no driver";
  h.which = [](const std::string& name) { return name == "python3" ? "/usr/bin/python3" : ""; };
  return h;
}

LaunchEnvLookup no_env() {
  return [](const std::string&) { return std::optional<std::string>(); };
}

Result<LaunchOptions> parse(const std::vector<std::string>& args, const HostFacts& h = host(),
                            const LaunchEnvLookup& env = no_env()) {
  return parse_launch_args(args, h, env, kSubcommands);
}

// A flag written one of torchrun's ways: dash or underscore spelling, value apart or after '='.
void put(std::vector<std::string>& args, std::mt19937& rng, std::string flag, const std::string& value) {
  if (rng() % 2 == 1)
    for (size_t i = 2; i < flag.size(); ++i)
      if (flag[i] == '-') flag[i] = '_';
  if (rng() % 2 == 1) {
    args.push_back(flag + "=" + value);
  } else {
    args.push_back(flag);
    args.push_back(value);
  }
}

TEST_CASE("launch flags: random command lines read back as the values they were written from", "[launch]") {
  std::mt19937 rng(20261202);
  for (int trial = 0; trial < 300; ++trial) {
    const int nnodes = 1 + static_cast<int>(rng() % 8);
    const int node_rank = static_cast<int>(rng() % nnodes);
    const int nproc = 1 + static_cast<int>(rng() % 64);
    const int port = 1 + static_cast<int>(rng() % 65535);
    const int restarts = static_cast<int>(rng() % 5);
    const std::string id = "job" + std::to_string(rng() % 100000);
    const std::string role = "role" + std::to_string(rng() % 10);
    const std::string master = "10.0." + std::to_string(rng() % 256) + "." + std::to_string(rng() % 256);
    std::vector<std::pair<std::string, std::string>> flags = {
        {"--nnodes", rng() % 2 ? std::to_string(nnodes) : std::to_string(nnodes) + ":" + std::to_string(nnodes)},
        {"--node-rank", std::to_string(node_rank)},
        {"--nproc-per-node", std::to_string(nproc)},
        {"--rdzv-endpoint", master + ":" + std::to_string(port)},
        {"--rdzv-id", id},
        {"--role", role},
        {"--max-restarts", std::to_string(restarts)},
    };
    std::shuffle(flags.begin(), flags.end(), rng);
    std::vector<std::string> args;
    for (const auto& [f, v] : flags) put(args, rng, f, v);
    const bool dashes = rng() % 2 == 0;
    if (dashes) args.push_back("--");
    args.insert(args.end(), {"train", "--lr", "1e-3"});
    auto o = parse(args);
    INFO([&] {
      std::string s;
      for (const auto& a : args) s += a + " ";
      return s;
    }());
    REQUIRE(o);
    CHECK(o->nnodes == nnodes);
    CHECK(o->node_rank == node_rank);
    CHECK(o->nproc_per_node == nproc);
    CHECK(o->master_addr == master);
    CHECK(o->master_port == port);
    CHECK(o->rdzv_id == id);
    CHECK(o->role == role);
    CHECK(o->max_restarts == restarts);
    CHECK(o->command == std::vector<std::string>{"train", "--lr", "1e-3"});
    CHECK(command_kind(*o, kSubcommands) == CommandKind::troupe);
  }
}

TEST_CASE("launch flags: --redirects / --tee maps give each local rank its value, others 0", "[launch]") {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::map<int, int> want;
    const int n = 1 + static_cast<int>(rng() % 6);
    std::string text;
    for (int i = 0; i < n; ++i) {
      const int rank = static_cast<int>(rng() % 12), value = static_cast<int>(rng() % 4);
      want[rank] = value;  // a later pair for the same rank wins, as in torchrun's dict
      text += (text.empty() ? "" : ",") + std::to_string(rank) + ":" + std::to_string(value);
    }
    auto s = parse_std_streams("--tee", text);
    REQUIRE(s);
    for (int r = 0; r < 16; ++r) CHECK(s->of(r) == (want.count(r) ? want[r] : 0));
  }
  for (int v = 0; v <= 3; ++v) {
    auto s = parse_std_streams("-r", std::to_string(v));
    REQUIRE(s);
    for (int r = 0; r < 5; ++r) CHECK(s->of(r) == v);
  }
  for (const char* bad : {"4", "", "0:", ":1", "0:1,", "0:12", "a:1", "0=1", "-1:1"})
    CHECK_FALSE(parse_std_streams("--tee", bad));
}

TEST_CASE("launch flags: --nproc-per-node auto, cpu, gpu as torchrun resolves them", "[launch]") {
  CHECK(parse({"--nproc-per-node", "cpu", "train"})->nproc_per_node == 8);
  CHECK(parse({"--nproc-per-node", "auto", "train"})->nproc_per_node == 8);  // no GPU: the CPUs
  CHECK(parse({"--nproc-per-node", "auto", "train"}, host(8, 3))->nproc_per_node == 3);
  CHECK(parse({"--nproc-per-node", "gpu", "train"}, host(8, 2))->nproc_per_node == 2);
  auto none = parse({"--nproc-per-node", "gpu", "train"});
  REQUIRE_FALSE(none);
  CHECK(none.status().is_bad_input());
  CHECK_THAT(none.status().message(), Contains("no CUDA device is visible to this process (no driver)"));
  CHECK_FALSE(parse({"--nproc-per-node", "0", "train"}));
  CHECK_FALSE(parse({"--nproc-per-node", "xpu", "train"}));
}

TEST_CASE("launch flags: --nnodes MIN:MAX is elastic, with node ranks and a fixed global batch", "[launch]") {
  const std::vector<std::string> train = {"train", "--global-batch-size", "12"};
  for (const auto& [text, ok] : std::vector<std::pair<std::string, bool>>{
           {"2:2", true}, {"2", true}, {"1:4", true}, {"3:2", false}, {"0", false}, {"1:2:3", false}, {"x", false}}) {
    std::vector<std::string> args = {"--nnodes", text, "--node-rank", "0", "--master-addr", "node0"};
    args.insert(args.end(), train.begin(), train.end());
    auto o = parse(args);
    CHECK(bool(o) == ok);
    if (o) CHECK(o->elastic() == (text == "1:4"));
    if (!o && text == "3:2") CHECK_THAT(o.status().message(), Contains("MIN is above MAX"));
  }
  auto o = parse({"--nnodes", "1:4", "--node-rank", "3", "--master-addr", "node0", "--rdzv-conf", "last_call_timeout=2",
                  "train", "--global-batch-size", "12"});
  REQUIRE(o);
  CHECK(o->min_nnodes == 1);
  CHECK(o->nnodes == 4);
  CHECK(o->last_call_s == 2);
  // Each problem of an elastic train at once: no node rank, a fixed data-parallel size, no global batch.
  const std::string m = parse({"--nnodes", "1:2", "--master-addr", "node0", "--master-port", "65535", "train",
                               "--data-parallel-size", "2"})
                            .status()
                            .message();
  CHECK_THAT(m, Contains("4 problems"));
  CHECK_THAT(m, Contains("--nnodes 1:2 needs each node's --node-rank"));
  CHECK_THAT(m, Contains("the master's port + 1"));
  CHECK_THAT(m, Contains("with train --data-parallel-size: the data-parallel size follows the nodes"));
  CHECK_THAT(m, Contains("no --global-batch-size"));
  // Spares: node ranks up to N+K-1, node ranks needed, a master others reach.
  auto spare = parse({"--nnodes", "2", "--spares", "1", "--node-rank", "2", "--master-addr", "node0", "train"});
  REQUIRE(spare);
  CHECK(spare->rounds());
  CHECK_FALSE(spare->elastic());
  CHECK_THAT(parse({"--nnodes", "2", "--spares", "1", "--node-rank", "3", "--master-addr", "node0", "train"})
                 .status()
                 .message(),
             Contains("--node-rank 3 is outside [0, 3) for --nnodes 2 --spares 1"));
  const std::string sm = parse({"--nnodes", "1", "--spares", "2", "train"}).status().message();
  CHECK_THAT(sm, Contains("--spares 2 needs each node's --node-rank (0 .. 2"));
  CHECK_THAT(sm, Contains("needs the host of node 0"));
  CHECK_FALSE(parse({"--spares", "-1", "train"}));
  // A fixed membership: the last call is noted as having no effect.
  auto fixed = parse({"--rdzv-conf", "last_call_timeout=5", "train"});
  REQUIRE(fixed);
  CHECK_FALSE(fixed->elastic());
  CHECK(std::any_of(fixed->notes.begin(), fixed->notes.end(),
                    [](const std::string& n) { return n.find("last_call_timeout: no effect") != std::string::npos; }));
}

TEST_CASE("launch flags: in-job recovery needs restarts and a fixed membership", "[launch]") {
  auto o = parse({"--nproc-per-node", "2", "--max-restarts", "3", "--in-job-recovery", "train"});
  REQUIRE(o);
  CHECK(o->in_job_recovery);
  CHECK(o->max_restarts == 3);
  CHECK_FALSE(parse({"--nproc-per-node", "2", "train"})->in_job_recovery);
  const std::string m = parse({"--nnodes", "1:2", "--node-rank", "0", "--master-addr", "node0", "--in-job-recovery",
                               "train", "--global-batch-size", "8"})
                            .status()
                            .message();
  CHECK_THAT(m, Contains("2 problems"));
  CHECK_THAT(m, Contains("--in-job-recovery needs --max-restarts N"));
  CHECK_THAT(m, Contains("--in-job-recovery with --nnodes MIN:MAX"));
  // With spares: warm spare processes in the running job (no rounds); node ranks N .. N+K-1 are spare nodes.
  auto warm = parse({"--nnodes", "2", "--spares", "1", "--node-rank", "2", "--master-addr", "node0", "--max-restarts",
                     "1", "--in-job-recovery", "train"});
  REQUIRE(warm);
  CHECK(warm->warm_spares());
  CHECK(warm->spare_node());
  CHECK_FALSE(warm->rounds());
  auto member = parse({"--nnodes", "2", "--spares", "1", "--node-rank", "1", "--master-addr", "node0", "--max-restarts",
                       "1", "--in-job-recovery", "train"});
  REQUIRE(member);
  CHECK(member->warm_spares());
  CHECK_FALSE(member->spare_node());
  const std::string wm = parse({"--nnodes", "2", "--spares", "1", "--master-addr", "node0", "--max-restarts", "1",
                                "--in-job-recovery", "--", "python3", "x.py"})
                             .status()
                             .message();
  CHECK_THAT(wm, Contains("--spares 1 needs each node's --node-rank (0 .. 2: the spare nodes are 2 .. 2)"));
  CHECK_THAT(wm, Contains("the warm spares are troupe train processes"));
  // No split brain: fewer spare nodes than nodes (one node and one spare is fine: the spares alone never host).
  const std::string split = parse({"--nnodes", "2", "--spares", "2", "--node-rank", "0", "--master-addr", "node0",
                                   "--max-restarts", "1", "--in-job-recovery", "train"})
                                .status()
                                .message();
  CHECK_THAT(split, Contains("--in-job-recovery --spares 2 with --nnodes 2") && Contains("at most 1 spare node(s)"));
  CHECK(parse({"--nnodes", "1", "--spares", "1", "--node-rank", "0", "--master-addr", "node0", "--max-restarts", "1",
               "--in-job-recovery", "train"}));
  CHECK(parse({"--nnodes", "3", "--spares", "2", "--node-rank", "4", "--master-addr", "node0", "--max-restarts", "1",
               "--in-job-recovery", "train"}));
}

TEST_CASE("launch flags: every problem at once, with the fix", "[launch]") {
  auto o = parse({"--nnodes", "1:2", "--rdzv-backend", "etcd-v2", "--tee", "9", "--nprocs", "4", "-m",
                  "--rdzv-conf", "join_timeout=-1,read_timeout=5", "--logs-specs", "x", "--", "x.py"});
  REQUIRE_FALSE(o);
  CHECK(o.status().is_bad_input());
  const std::string m = o.status().message();
  CHECK_THAT(m, Contains("9 problems with the flags of troupe launch:"));
  CHECK_THAT(m, Contains("--nnodes 1:2 needs each node's --node-rank"));
  CHECK_THAT(m, Contains("--nnodes 2 needs the host of node 0"));
  CHECK_THAT(m, Contains("--rdzv-backend etcd-v2: troupe's rendezvous is its own"));
  CHECK_THAT(m, Contains("--tee 9: give 0 (none)"));
  CHECK_THAT(m, Contains("--nprocs: not a flag of troupe launch"));
  CHECK_THAT(m, Contains("--module: troupe cannot run Python modules in-process"));
  CHECK_THAT(m, Contains("join_timeout=-1: the rendezvous timeout must be seconds"));
  CHECK_THAT(m, Contains("--logs-specs x: troupe cannot load"));
  CHECK_THAT(m, Contains("'x.py' is neither a troupe subcommand nor a program on PATH"));
  CHECK_THAT(m, Contains("write -- python3 x.py"));
}

TEST_CASE("launch flags: several nodes need a master others reach and, under c10d, node ranks", "[launch]") {
  CHECK_THAT(parse({"--nnodes", "2", "train"}).status().message(), Contains("needs the host of node 0"));
  CHECK_THAT(parse({"--nnodes", "2", "--master-addr", "127.0.0.1", "train"}).status().message(),
             Contains("a loopback address"));
  CHECK_THAT(parse({"--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "n0:29400", "train"}).status().message(),
             Contains("does not hand out node ranks"));
  CHECK_THAT(parse({"--nnodes", "2", "--node-rank", "2", "--master-addr", "n0", "train"}).status().message(),
             Contains("--node-rank 2 is outside [0, 2)"));
  CHECK_THAT(parse({"--rdzv-endpoint", "n0:1", "--master-addr", "n1", "train"}).status().message(),
             Contains("name different hosts"));
  auto v6 = parse({"--rdzv-endpoint", "[fd00::1]:2345", "--nnodes", "2", "--node-rank", "1", "train"});
  REQUIRE(v6);
  CHECK(v6->master_addr == "fd00::1");
  CHECK(v6->master_port == 2345);
  CHECK(parse({"--rdzv-endpoint", "n0", "train"})->master_port == 29400);  // torchrun's default port
}

TEST_CASE("launch flags: torchrun's PET_ variables fill what the command line leaves out", "[launch]") {
  std::map<std::string, std::string> vars = {{"PET_NPROC_PER_NODE", "5"}, {"PET_RDZV_ID", "fromenv"},
                                             {"PET_STANDALONE", "0"}, {"PET_MAX_RESTARTS", "2"}};
  auto env = [&](const std::string& n) -> std::optional<std::string> {
    auto it = vars.find(n);
    return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
  auto o = parse({"--max-restarts", "1", "train"}, host(), env);
  REQUIRE(o);
  CHECK(o->nproc_per_node == 5);
  CHECK(o->rdzv_id == "fromenv");
  CHECK_FALSE(o->standalone);
  CHECK(o->max_restarts == 1);  // the command line wins
  vars["PET_NNODES"] = "3:1";
  CHECK_THAT(parse({"train"}, host(), env).status().message(), Contains("PET_NNODES 3:1: MIN is above MAX"));
}

TEST_CASE("launch flags: the command, --no-python, --run-path, --standalone, abbreviations", "[launch]") {
  auto t = parse({"--nproc_per_node=2", "troupe", "train", "--lr", "1"});  // the program name goes
  REQUIRE(t);
  CHECK(t->command == std::vector<std::string>{"train", "--lr", "1"});
  auto p = parse({"python3", "x.py", "--nproc-per-node", "3"});  // after the command: its own
  REQUIRE(p);
  CHECK(p->nproc_per_node == 1);
  CHECK(command_kind(*p, kSubcommands) == CommandKind::program);
  auto np = parse({"--no-python", "--", "/bin/train", "x"});
  REQUIRE(np);
  CHECK(command_kind(*np, kSubcommands) == CommandKind::program);
  auto rp = parse({"--run-path", "/abs/script.py", "a"});
  REQUIRE(rp);
  CHECK(rp->run_path);
  CHECK(rp->command == std::vector<std::string>{"/abs/script.py", "a"});
  auto sa = parse({"--standalone", "--rdzv-endpoint", "n0:1", "train"});
  REQUIRE(sa);
  CHECK(sa->master_addr == "127.0.0.1");
  CHECK_FALSE(sa->master_port_given);
  CHECK(sa->rdzv_backend == "c10d");
  CHECK_FALSE(parse({"--standalone", "--nnodes", "2", "--master-addr", "n0", "train"}));
  auto ab = parse({"--nproc", "4", "--max_r", "2", "train"});  // argparse's unique prefixes
  REQUIRE(ab);
  CHECK(ab->nproc_per_node == 4);
  CHECK(ab->max_restarts == 2);
  CHECK_THAT(parse({"--rdzv", "x", "train"}).status().message(), Contains("--rdzv: not a flag"));  // ambiguous
  auto notes = parse({"--start-method", "fork", "--monitor-interval", "5", "--rdzv-conf", "read_timeout=60", "train"});
  REQUIRE(notes);
  CHECK(notes->notes.size() == 3);
  CHECK(parse({"--help"})->help);
  CHECK(parse({"--new-token"})->new_token);
  CHECK_THAT(parse({}).status().message(), Contains("no command to run"));
}

// docs/COMPAT.md's "troupe launch vs torchrun" table names every torchrun flag troupe reads.
TEST_CASE("launch flags: docs/COMPAT.md lists every torchrun flag", "[launch]") {
  std::ifstream in(test::source_dir() + "/docs/COMPAT.md");
  REQUIRE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  for (const LaunchFlagRow& row : launch_flag_table()) {
    INFO(row.flag);
    CHECK(text.str().find("| `" + row.flag) != std::string::npos);
  }
}

}  // namespace
}  // namespace troupe
