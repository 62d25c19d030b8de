// Bootstrap: how the ranks of a job find each other before any communicator exists. Rank 0 runs a
// rendezvous; every rank registers with the job's secret token, learns the world size, and exchanges
// small blobs (UCX worker addresses, NCCL unique ids) through it. Control traffic only: tensors never
// go through the bootstrap.
//
// Implementations: CafBootstrap (comm/bootstrap/caf_bootstrap.*: a rendezvous actor published with CAF's io
// middleman, used by `troupe launch`, SLURM and mpirun starts) and, for ranks that are threads of one
// process, an in-process one.
#pragma once
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "troupe/status.hpp"

namespace troupe::comm {

class Bootstrap {
 public:
  virtual ~Bootstrap() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Collective over all ranks: every rank contributes `mine` under `key` (a key is used once) and gets
  // every rank's blob in rank order. Fails (never hangs) when a rank disconnects or a timeout passes.
  virtual Result<std::vector<std::string>> all_gather(const std::string& key, const std::string& mine) = 0;
  virtual Status barrier(const std::string& key) = 0;
  // The network devices UCX should use for this job (UCX_NET_DEVICES syntax, e.g. "lo" for a
  // one-host job: comm/bootstrap/net_plan.hpp); "" leaves UCX's own choice. create_ucx_world applies it.
  virtual std::string ucx_net_devices() const { return {}; }
  // How often `what` was asked for on this bootstrap object before (0 the first time): every rank
  // makes the same calls in the same order, so collectives repeated over one bootstrap (worlds
  // created on it) get keys of their own. Kept in the object, so a new bootstrap (a process that
  // rejoins after a failure) counts from 0 like a new process. Any thread.
  int next_use(const std::string& what) {
    std::lock_guard<std::mutex> lock(uses_mu_);
    return uses_[what]++;
  }

 private:
  std::mutex uses_mu_;
  std::map<std::string, int> uses_;
};

}  // namespace troupe::comm
