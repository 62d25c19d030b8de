// Launch environment detection from fake environments: each starter, precedence, hostlists, tokens.
#include <catch2/catch.hpp>
#include <map>
#include <set>
#include <string>

#include "comm/bootstrap/launch_env.hpp"

namespace troupe::comm {
namespace {

using Catch::Contains;
using Vars = std::map<std::string, std::string>;

const std::string kToken = "0123456789abcdef0123456789abcdef";

LaunchEnv detect_ok(const Vars& vars) {
  auto r = detect_launch_env(map_env(vars));
  INFO((r ? std::string("ok") : r.status().message()));
  REQUIRE(r);
  return *r;
}

std::string detect_error(const Vars& vars) {
  auto r = detect_launch_env(map_env(vars));
  REQUIRE_FALSE(r);
  return r.status().message();
}

TEST_CASE("no starter: a single process with a fresh token", "[launch_env]") {
  const LaunchEnv e = detect_ok({});
  CHECK(e.source == "single process");
  CHECK(e.rank == 0);
  CHECK(e.world_size == 1);
  CHECK(e.local_world_size == 1);
  CHECK(e.master_port == 29500);
  CHECK(e.token.size() == 64);
}

TEST_CASE("troupe launch variables", "[launch_env]") {
  const LaunchEnv e = detect_ok({{"TROUPE_RANK", "5"},
                                 {"TROUPE_WORLD_SIZE", "8"},
                                 {"TROUPE_LOCAL_RANK", "1"},
                                 {"TROUPE_LOCAL_WORLD_SIZE", "4"},
                                 {"TROUPE_MASTER_ADDR", "node01"},
                                 {"TROUPE_MASTER_PORT", "29611"},
                                 {"TROUPE_JOB_TOKEN", kToken}});
  CHECK(e.source == "troupe launch");
  CHECK(e.rank == 5);
  CHECK(e.world_size == 8);
  CHECK(e.local_rank == 1);
  CHECK(e.local_world_size == 4);
  CHECK(e.master_addr == "node01");
  CHECK(e.master_port == 29611);
  CHECK(e.token == kToken);
  CHECK(describe_launch(e) == "rank 5/8 (local 1/4), master node01:29611, from troupe launch");
  CHECK_THAT(describe_launch(e), !Contains(kToken));
}

TEST_CASE("the node's index: GROUP_RANK, SLURM_NODEID, else from the ranks", "[launch_env]") {
  const Vars launch = {{"TROUPE_RANK", "5"},         {"TROUPE_WORLD_SIZE", "8"},          {"TROUPE_LOCAL_RANK", "1"},
                       {"TROUPE_LOCAL_WORLD_SIZE", "2"}, {"TROUPE_MASTER_ADDR", "node01"}, {"TROUPE_JOB_TOKEN", kToken}};
  CHECK(detect_ok(launch).node_rank == 2);  // (5 - 1) / 2
  Vars given = launch;
  given["GROUP_RANK"] = "3";
  CHECK(detect_ok(given).node_rank == 3);
  given["GROUP_RANK"] = "8";
  CHECK_THAT(detect_error(given), Contains("GROUP_RANK=8 is not a node of a job of 8"));
  given["GROUP_RANK"] = "x";
  CHECK_THAT(detect_error(given), Contains("GROUP_RANK"));
  const Vars slurm = {{"SLURM_PROCID", "3"},  {"SLURM_NTASKS", "4"},   {"SLURM_LOCALID", "1"},
                      {"SLURM_NODEID", "1"}, {"SLURM_NTASKS_PER_NODE", "2"}, {"SLURM_JOB_NODELIST", "n[1-2]"},
                      {"TROUPE_JOB_TOKEN", kToken}};
  CHECK(detect_ok(slurm).node_rank == 1);
  CHECK(detect_ok({}).node_rank == 0);
}

// troupe launch --in-job-recovery --spares: a warm spare has rank -1 (TROUPE_SPARE=1) until the job
// gives it a place, and its node index may be past the job's nodes; without TROUPE_SPARE rank -1 is
// refused, and a spare that names a rank too.
TEST_CASE("a warm spare of troupe launch: no rank yet", "[launch_env]") {
  Vars spare = {{"TROUPE_RANK", "-1"},       {"TROUPE_WORLD_SIZE", "2"},         {"TROUPE_LOCAL_RANK", "1"},
                {"TROUPE_LOCAL_WORLD_SIZE", "2"}, {"TROUPE_MASTER_ADDR", "node01"}, {"TROUPE_JOB_TOKEN", kToken},
                {"GROUP_RANK", "3"},         {"TROUPE_SPARE", "1"}};
  const LaunchEnv e = detect_ok(spare);
  CHECK(e.spare);
  CHECK(e.rank == -1);
  CHECK(e.node_rank == 3);
  CHECK(e.local_rank == 1);
  CHECK(describe_launch(e) == "a spare of 2 (local 1/2), master node01:29500, from troupe launch");
  Vars not_spare = spare;
  not_spare.erase("TROUPE_SPARE");
  CHECK_THAT(detect_error(not_spare), Contains("rank -1 is outside the world of 2"));
  Vars ranked = spare;
  ranked["TROUPE_RANK"] = "1";
  CHECK_THAT(detect_error(ranked), Contains("TROUPE_SPARE=1 with TROUPE_RANK=1"));
  CHECK_FALSE(detect_ok({{"TROUPE_RANK", "1"}, {"TROUPE_WORLD_SIZE", "2"}, {"TROUPE_MASTER_ADDR", "node01"},
                         {"TROUPE_JOB_TOKEN", kToken}}).spare);
}

TEST_CASE("torchrun variables, and troupe launch's win over them and over SLURM", "[launch_env]") {
  Vars torchrun = {{"RANK", "2"},
                   {"WORLD_SIZE", "4"},
                   {"LOCAL_RANK", "2"},
                   {"LOCAL_WORLD_SIZE", "4"},
                   {"MASTER_ADDR", "10.0.0.7"},
                   {"MASTER_PORT", "29400"},
                   {"TROUPE_JOB_TOKEN", kToken}};
  LaunchEnv e = detect_ok(torchrun);
  CHECK(e.source == "torchrun env");
  CHECK(e.rank == 2);
  CHECK(e.master_addr == "10.0.0.7");
  CHECK(e.master_port == 29400);

  Vars both = torchrun;
  both.insert({{"SLURM_PROCID", "7"}, {"SLURM_NTASKS", "16"}});
  CHECK(detect_ok(both).source == "torchrun env");
  both.insert({{"TROUPE_RANK", "1"},
               {"TROUPE_WORLD_SIZE", "4"},
               {"TROUPE_MASTER_ADDR", "127.0.0.1"},
               {"TROUPE_MASTER_PORT", "29501"}});
  e = detect_ok(both);
  CHECK(e.source == "troupe launch");
  CHECK(e.rank == 1);
  CHECK(e.master_addr == "127.0.0.1");  // TROUPE_MASTER_ADDR before MASTER_ADDR
  CHECK(e.master_port == 29501);
  CHECK(e.local_rank == 2);  // TROUPE_LOCAL_RANK missing: LOCAL_RANK is read
}

TEST_CASE("torchrun without a token is refused with the fix", "[launch_env]") {
  const std::string err =
      detect_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}});
  CHECK_THAT(err, Contains("TROUPE_JOB_TOKEN"));
  CHECK_THAT(err, Contains("troupe launch --new-token"));
  // One rank needs none.
  CHECK(detect_ok({{"RANK", "0"}, {"WORLD_SIZE", "1"}}).token.size() == 64);
}

TEST_CASE("SLURM variables", "[launch_env]") {
  Vars slurm = {{"SLURM_PROCID", "6"},
                {"SLURM_NTASKS", "8"},
                {"SLURM_LOCALID", "2"},
                {"SLURM_NODEID", "1"},
                {"SLURM_TASKS_PER_NODE", "4(x2)"},
                {"SLURM_JOB_NODELIST", "gpu-a[07-08],gpu-b1"},
                {"SLURM_JOB_ID", "123456"},
                {"TROUPE_JOB_TOKEN", kToken}};
  LaunchEnv e = detect_ok(slurm);
  CHECK(e.source == "SLURM");
  CHECK(e.rank == 6);
  CHECK(e.world_size == 8);
  CHECK(e.local_rank == 2);
  CHECK(e.local_world_size == 4);
  CHECK(e.master_addr == "gpu-a07");
  CHECK(e.master_port == 20000 + 123456 % 10000);

  SECTION(
      "SLURM_NTASKS_PER_NODE wins over SLURM_TASKS_PER_NODE; uneven nodes index by SLURM_NODEID") {
    slurm["SLURM_TASKS_PER_NODE"] = "3,5";
    CHECK(detect_ok(slurm).local_world_size == 5);
    slurm["SLURM_NTASKS_PER_NODE"] = "4";
    CHECK(detect_ok(slurm).local_world_size == 4);
  }
  SECTION("MASTER_ADDR and MASTER_PORT override") {
    slurm["MASTER_ADDR"] = "10.1.2.3";
    slurm["MASTER_PORT"] = "31000";
    e = detect_ok(slurm);
    CHECK(e.master_addr == "10.1.2.3");
    CHECK(e.master_port == 31000);
  }
  SECTION("the step's nodelist before the job's") {
    slurm["SLURM_STEP_NODELIST"] = "gpu-b[3-4]";
    CHECK(detect_ok(slurm).master_addr == "gpu-b3");
  }
  SECTION("no token: refused, saying to export it before srun") {
    slurm.erase("TROUPE_JOB_TOKEN");
    const std::string err = detect_error(slurm);
    CHECK_THAT(err, Contains("export TROUPE_JOB_TOKEN=$(troupe launch --new-token)"));
    CHECK_THAT(err, Contains("srun"));
  }
  SECTION("a bad token is refused") {
    slurm["TROUPE_JOB_TOKEN"] = "short";
    CHECK_THAT(detect_error(slurm), Contains("TROUPE_JOB_TOKEN must be 16 to 256"));
  }
  SECTION("a non-integer rank names the variable") {
    slurm["SLURM_PROCID"] = "six";
    CHECK_THAT(detect_error(slurm), Contains("SLURM_PROCID='six' is not an integer"));
  }
  SECTION("a rank outside the world") {
    slurm["SLURM_PROCID"] = "8";
    CHECK_THAT(detect_error(slurm), Contains("outside the world of 8"));
  }
}

TEST_CASE("Open MPI variables and the master heuristic", "[launch_env]") {
  Vars ompi = {{"OMPI_COMM_WORLD_RANK", "3"},
               {"OMPI_COMM_WORLD_SIZE", "4"},
               {"OMPI_COMM_WORLD_LOCAL_RANK", "3"},
               {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
               {"OMPI_MCA_ess_base_jobid", "3172007937"},
               {"TROUPE_JOB_TOKEN", kToken}};
  SECTION("all ranks on this node: loopback") {
    const LaunchEnv e = detect_ok(ompi);
    CHECK(e.source == "Open MPI");
    CHECK(e.rank == 3);
    CHECK(e.local_world_size == 4);
    CHECK(e.master_addr == "127.0.0.1");
    CHECK(e.master_port == 20000 + static_cast<int>(3172007937ull % 10000));
  }
  ompi["OMPI_COMM_WORLD_LOCAL_SIZE"] = "2";
  ompi["OMPI_COMM_WORLD_LOCAL_RANK"] = "1";
  SECTION("several nodes: mpirun's HNP URI (Open MPI 4)") {
    ompi["OMPI_MCA_orte_hnp_uri"] = "3172007936.0;tcp://10.0.0.1,172.17.0.1:52345";
    CHECK(detect_ok(ompi).master_addr == "10.0.0.1");
  }
  SECTION("several nodes: the PRRTE namespace (Open MPI 5)") {
    ompi.erase("OMPI_MCA_ess_base_jobid");
    ompi["PMIX_NAMESPACE"] = "prterun-login-node-2-4711@1";
    const LaunchEnv e = detect_ok(ompi);
    CHECK(e.master_addr == "login-node-2");
    CHECK(e.master_port >= 20000);
    CHECK(e.master_port < 30000);
  }
  SECTION("MASTER_ADDR wins") {
    ompi["OMPI_MCA_orte_hnp_uri"] = "3172007936.0;tcp://10.0.0.1:52345";
    ompi["MASTER_ADDR"] = "node17";
    CHECK(detect_ok(ompi).master_addr == "node17");
  }
  SECTION("several nodes and no clue: refused, naming mpirun -x MASTER_ADDR") {
    CHECK_THAT(detect_error(ompi), Contains("mpirun -x MASTER_ADDR="));
  }
  SECTION("no token: refused, naming mpirun -x TROUPE_JOB_TOKEN") {
    ompi["MASTER_ADDR"] = "node17";
    ompi.erase("TROUPE_JOB_TOKEN");
    CHECK_THAT(detect_error(ompi), Contains("mpirun -x TROUPE_JOB_TOKEN"));
  }
}

TEST_CASE("SLURM before Open MPI", "[launch_env]") {
  const LaunchEnv e = detect_ok({{"SLURM_PROCID", "0"},
                                 {"SLURM_NTASKS", "2"},
                                 {"SLURM_JOB_NODELIST", "n1"},
                                 {"OMPI_COMM_WORLD_RANK", "1"},
                                 {"OMPI_COMM_WORLD_SIZE", "2"},
                                 {"TROUPE_JOB_TOKEN", kToken}});
  CHECK(e.source == "SLURM");
  CHECK(e.rank == 0);
}

TEST_CASE("hostlist expansion", "[launch_env]") {
  using V = std::vector<std::string>;
  auto ok = [](const std::string& list) {
    auto r = expand_hostlist(list);
    INFO(list << ": " << (r ? std::string("ok") : r.status().message()));
    REQUIRE(r);
    return *r;
  };
  CHECK(ok("node01") == V{"node01"});
  CHECK(ok("node[01-04,07],gpu-a[1-2]") ==
        V{"node01", "node02", "node03", "node04", "node07", "gpu-a1", "gpu-a2"});
  CHECK(ok("n[08-10]") == V{"n08", "n09", "n10"});
  CHECK(ok("n[9-11]") == V{"n9", "n10", "n11"});
  CHECK(ok("a,b[3],c") == V{"a", "b3", "c"});
  CHECK(ok("r[1-2]n[1-2]") == V{"r1n1", "r1n2", "r2n1", "r2n2"});
  CHECK(ok("rack1-node[5-6].cluster") == V{"rack1-node5.cluster", "rack1-node6.cluster"});
  for (const char* bad : {"", "node[1-", "node[a-b]", "node[4-2]", "node]1[", "n[1-2000000]"}) {
    auto r = expand_hostlist(bad);
    INFO(bad);
    CHECK_FALSE(r);
    if (!r) CHECK_THAT(r.status().message(), Contains("hostlist"));
  }
}

TEST_CASE("tasks per node", "[launch_env]") {
  CHECK(*expand_tasks_per_node("4(x2),2") == std::vector<int>{4, 4, 2});
  CHECK(*expand_tasks_per_node("8") == std::vector<int>{8});
  CHECK_FALSE(expand_tasks_per_node("4(x"));
  CHECK_FALSE(expand_tasks_per_node("x"));
  CHECK_FALSE(expand_tasks_per_node("0"));
}

TEST_CASE("tokens: random, hex, validated, compared whole", "[launch_env]") {
  std::set<std::string> seen;
  for (int i = 0; i < 8; ++i) {
    auto t = generate_job_token();
    REQUIRE(t);
    CHECK(t->size() == 64);
    CHECK(t->find_first_not_of("0123456789abcdef") == std::string::npos);
    CHECK(validate_job_token(*t, "T"));
    seen.insert(*t);
  }
  CHECK(seen.size() == 8);
  CHECK_FALSE(validate_job_token("tooshort", "T"));
  CHECK_FALSE(validate_job_token("0123456789abcdef 123", "T"));
  CHECK(constant_time_equal(kToken, kToken));
  CHECK_FALSE(constant_time_equal(kToken, kToken.substr(0, 31)));
  CHECK_FALSE(constant_time_equal(kToken, kToken + "0"));
  CHECK_FALSE(constant_time_equal(kToken, "1" + kToken.substr(1)));
  CHECK_FALSE(constant_time_equal("", "x"));
  CHECK(constant_time_equal("", ""));
}

}  // namespace
}  // namespace troupe::comm
