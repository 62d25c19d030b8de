// Where this process sits in a job: its rank, the world size, and how to reach rank 0's
// rendezvous, read from the environment the starter left. Sources, first match wins:
//
// "troupe launch": TROUPE_RANK is set. Reads TROUPE_RANK, TROUPE_WORLD_SIZE, TROUPE_LOCAL_RANK,
//   TROUPE_LOCAL_WORLD_SIZE, TROUPE_MASTER_ADDR, TROUPE_MASTER_PORT, TROUPE_JOB_TOKEN (each
//   falling back to torchrun's name).
// "torchrun env": RANK is set (torchrun, or a script written for it). Reads RANK, WORLD_SIZE,
//   LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT; the token from TROUPE_JOB_TOKEN.
// "SLURM": SLURM_PROCID is set (a task of srun). Reads SLURM_PROCID, SLURM_NTASKS (SLURM_NPROCS),
//   SLURM_LOCALID, and SLURM_NTASKS_PER_NODE or this node's entry of SLURM_STEP_TASKS_PER_NODE /
//   SLURM_TASKS_PER_NODE ("4(x2),2" = 4,4,2; indexed by SLURM_NODEID). Master: the first host of
//   SLURM_STEP_NODELIST / SLURM_JOB_NODELIST / SLURM_NODELIST (srun places task 0 on the first
//   node of the step).
// "Open MPI": OMPI_COMM_WORLD_RANK is set (mpirun). Reads OMPI_COMM_WORLD_{RANK, SIZE,
//   LOCAL_RANK, LOCAL_SIZE}. Master, a heuristic: MASTER_ADDR if set; else 127.0.0.1 when every
//   rank is on this node (LOCAL_SIZE == SIZE); else mpirun's host, taken from the first address
//   of its URI (Open MPI 4: OMPI_MCA_orte_hnp_uri = "<jobid>;tcp://10.0.0.1,10.1.0.1:40000") or
//   from the job's namespace (Open MPI 5: PMIX_NAMESPACE = "prterun-<host>-<pid>@1"). That is
//   right when mpirun runs on the node of rank 0 (the usual batch script); where it does not,
//   pass `mpirun -x MASTER_ADDR=<rank 0's host>`.
// "single process": none of the above. Rank 0 of 1.
//
// Under SLURM and Open MPI, TROUPE_MASTER_ADDR / MASTER_ADDR and TROUPE_MASTER_PORT / MASTER_PORT
// override the derived values. Without one, the master port is derived from the job id
// (SLURM_JOB_ID, OMPI_MCA_ess_base_jobid, PMIX_NAMESPACE) into [20000, 29999] so two jobs sharing
// a node do not collide; else it is 29500 (torchrun's default).
//
// The job token: every multi-process job has a secret from which its ranks derive the key of
// their TLS connections to the rendezvous (comm/bootstrap/psk_tls.hpp; the token itself is never sent).
// `troupe launch` makes one; a job started by srun, mpirun or torchrun must carry TROUPE_JOB_TOKEN
// (the same value on all ranks), or detection fails saying how to set it. A single process needs
// none (one is made).
//
// Thread safety: the functions are pure given the lookup; process_env() reads the live environment.
#pragma once
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/status.hpp"

namespace troupe::comm {

inline constexpr int kDefaultMasterPort = 29500;

struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  // This node's index in the job: GROUP_RANK (troupe launch, torchrun), SLURM_NODEID (SLURM), else
  // (rank - local_rank) / local_world_size (ranks placed node by node, as mpirun --map-by node does not).
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = kDefaultMasterPort;
  std::string token;  // secret shared by the job's ranks (hex); never printed
  // The launcher's --rdzv-id (TROUPE_RDZV_ID, any source), "" when none: the rendezvous refuses a
  // rank whose id is not rank 0's.
  std::string rdzv_id;
  // troupe launch --in-job-recovery --spares K: a warm spare, started without a rank (TROUPE_SPARE=1,
  // rank -1): the rendezvous gives it a lost rank's place (comm/bootstrap/caf_bootstrap.hpp).
  bool spare = false;
  std::string source =
      "single process";  // "troupe launch" | "torchrun env" | "SLURM" | "Open MPI" | ...
};

// Reads one environment variable: nullopt when unset. Empty values count as unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

EnvLookup process_env();
EnvLookup map_env(std::map<std::string, std::string> vars);  // for tests

// Detects the launch environment; errors name the variable and how to fix it.
Result<LaunchEnv> detect_launch_env(const EnvLookup& env = process_env());

// Expands a SLURM hostlist: "node[01-04,07],gpu-a[1-2]" -> node01..node04, node07, gpu-a1, gpu-a2.
// Zero padding of a range is kept ("[08-10]" -> 08, 09, 10). Several bracket groups in one name
// ("r[1-2]n[1-2]") expand as a product, the last varying fastest.
Result<std::vector<std::string>> expand_hostlist(std::string_view list);

// Expands SLURM_TASKS_PER_NODE ("4(x2),2") into one count per node: 4, 4, 2.
Result<std::vector<int>> expand_tasks_per_node(std::string_view spec);

// A fresh job token: 32 bytes from /dev/urandom as 64 hex digits.
Result<std::string> generate_job_token();

// Accepted tokens: 16 to 256 characters from [0-9A-Za-z_-].
Status validate_job_token(std::string_view token, std::string_view variable);

// Compares in time independent of where the strings differ (the length is not secret).
bool constant_time_equal(std::string_view a, std::string_view b);

// One line for logs: "rank 2/8 (local 0/4), master 10.0.0.1:29500, from SLURM". No token.
std::string describe_launch(const LaunchEnv& env);

}  // namespace troupe::comm
