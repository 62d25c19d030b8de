// actors/supervisor.hpp.
#include "actors/supervisor.hpp"

#include <exception>
#include <memory>
#include <thread>

#include <caf/all.hpp>

#include "actors/messages.hpp"

namespace troupe {
namespace {

using OutcomePtr = std::shared_ptr<AttemptOutcome>;
using attempted_atom = caf::atom_constant<caf::atom("attempted")>;

}  // namespace
}  // namespace troupe

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::OutcomePtr)

namespace troupe {
namespace {

struct SupervisorState {
  JobLifecycle* lifecycle = nullptr;
  SupervisorHooks hooks;
  int attempt = 0;
  std::thread worker;  // the attempt running, if any
  caf::response_promise done;
  ~SupervisorState() {
    if (worker.joinable()) worker.join();
  }
};

// Starts attempt `n` on a thread of its own; its outcome comes back as (attempted, outcome).
void start_attempt(caf::stateful_actor<SupervisorState>* self, int n, const std::string& from = {}) {
  auto& st = self->state;
  st.attempt = n;
  st.lifecycle->enter(JobPhase::starting, n == 1 ? "" : "restart " + std::to_string(n - 1) + ": from " + from);
  if (st.worker.joinable()) st.worker.join();
  st.worker = std::thread([me = caf::actor_cast<caf::actor>(self), run = st.hooks.attempt, n] {
    auto out = std::make_shared<AttemptOutcome>();
    try {
      *out = run(n);
    } catch (const std::exception& e) {
      out->result = Status::error(std::string("the attempt threw: ") + e.what());
    }
    caf::anon_send(me, attempted_atom::value, out);
  });
}

caf::behavior supervisor(caf::stateful_actor<SupervisorState>* self, JobLifecycle* lifecycle, SupervisorHooks hooks) {
  self->state.lifecycle = lifecycle;
  self->state.hooks = std::move(hooks);
  return {
      [self](run_atom) -> caf::result<OutcomePtr> {
        auto& st = self->state;
        st.done = self->make_response_promise();
        start_attempt(self, 1);
        return caf::delegated<OutcomePtr>{};
      },
      [self](attempted_atom, const OutcomePtr& out) {
        auto& st = self->state;
        if (st.worker.joinable()) st.worker.join();
        auto fail = [&](Status why) {
          st.lifecycle->enter(JobPhase::failed, why.message());
          auto end = std::make_shared<AttemptOutcome>(*out);
          end->result = std::move(why);
          st.done.deliver(end);
        };
        if (out->result) {
          if (st.hooks.finished) st.hooks.finished(out->result.value());
          st.lifecycle->enter(JobPhase::finished);
          st.done.deliver(out);
          return;
        }
        if (Status st_restart = st.hooks.may_restart(*out, st.attempt); !st_restart) return fail(st_restart);
        st.lifecycle->enter(JobPhase::recovering, out->result.status().message());
        auto from = st.hooks.restart_from(*out, st.attempt);
        if (!from) return fail(from.status());
        start_attempt(self, st.attempt + 1, from.value());
      },
  };
}

}  // namespace

Result<TrainSummary> supervise(JobLifecycle& lifecycle, const SupervisorHooks& hooks) {
  TROUPE_CHECK(lifecycle.phase() == JobPhase::resolving, "supervise: the lifecycle must be in resolving");
  caf::actor_system_config cfg;
  cfg.set("scheduler.max-threads", 1);  // the supervisor only decides; attempts have threads of their own
  caf::actor_system system{cfg};
  auto sup = system.spawn(supervisor, &lifecycle, hooks);
  Result<TrainSummary> result = Status::error("the supervisor did not answer");
  caf::scoped_actor self{system};
  self->request(sup, caf::infinite, run_atom::value)
      .receive([&](const OutcomePtr& out) { result = out->result; },
               [&](const caf::error& err) {
                 result = Status::error("the supervisor failed: " + system.render(err));
               });
  self->send_exit(sup, caf::exit_reason::user_shutdown);
  return result;
}

}  // namespace troupe
