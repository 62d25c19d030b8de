#include "actors/offload_actor.hpp"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>

#include "actors/errors.hpp"
#include "actors/fault_injection.hpp"

namespace troupe {

namespace {

struct OffloadState {
  std::function<Status(const SaveRequest&)> commit;
  caf::actor listener;
  std::shared_ptr<HostPool> pool;  // held for the process's optimizer partitions
  Status failure;
};

offload_actor::behavior_type offload_behavior(offload_actor::stateful_pointer<OffloadState> self,
                                              std::function<Status(const SaveRequest&)> commit, caf::actor listener,
                                              std::shared_ptr<HostPool> pool) {
  // The writer yields to the compute threads: at the lowest priority it takes the cores' slack (and
  // a small share when there is none), so a save barely slows training and still finishes.
  (void)setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 19);
  name_exceptions(self, "the offload actor");
  self->state.commit = std::move(commit);
  self->state.listener = std::move(listener);
  self->state.pool = std::move(pool);
  auto failed = [self](const Status& st) {
    if (!self->state.failure) return;  // the first failure is the one reported
    self->state.failure = st;
    caf::anon_send(self->state.listener, failed_atom::value, "background checkpoint save: " + st.message());
  };
  return {
      [self, failed](write_atom, const ShardWrite& w) {
        if (!self->state.failure) return;  // a save already failed: the job is stopping
        throw_if_asked("offload", -1, w.iteration);
        if (Status st = write_shard_file(w.path, w.rank, w.contents); !st) return failed(st);
        crash_if_asked(w.iteration);
      },
      [self, failed](commit_atom, const SaveRequest& r) {
        if (!self->state.failure) return;
        if (Status st = self->state.commit(r); !st) failed(st);
      },
      [self](flush_atom) -> caf::result<ok_atom> {
        if (!self->state.failure) return make_actor_error(ActorErrc::failed, self->state.failure.message());
        return ok_atom::value;
      },
  };
}

}  // namespace

offload_actor spawn_offload(caf::actor_system& system, std::function<Status(const SaveRequest&)> commit,
                            caf::actor listener, std::shared_ptr<HostPool> pool) {
  return system.spawn<caf::detached>(offload_behavior, std::move(commit), std::move(listener), std::move(pool));
}

}  // namespace troupe
