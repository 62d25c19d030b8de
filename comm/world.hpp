// A rank's view of the whole job for one backend: it creates the communicators of the groups this rank
// belongs to (the TP, PP, DP and embedding groups the topology gives). group() is collective among the
// members only, called by each member with the same member list; members are world ranks and their
// order gives the group ranks. Group communicators of one world share its transport (UCX endpoints,
// shared memory) and never see each other's messages.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "troupe/status.hpp"

namespace troupe::comm {

class CommWorld {
 public:
  virtual ~CommWorld() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;
  virtual Result<std::unique_ptr<Communicator>> group(const std::vector<int>& members) = 0;
  // This process gives the world up (the job failed elsewhere and this process rejoins it: troupe
  // launch --in-job-recovery): every pending and later operation of its communicators fails soon,
  // with `why`, instead of waiting on peers that moved on. Any thread; the world must still be
  // destroyed after its users. Default: nothing (the operations fail by the backend's own means).
  virtual void abort(const std::string& why) { (void)why; }
  // The communicator over every rank.
  Result<std::unique_ptr<Communicator>> everyone();
};

}  // namespace troupe::comm
