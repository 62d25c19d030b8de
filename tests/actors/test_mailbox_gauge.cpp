// The mailbox depth on the inspector's board (engine/activity.hpp, ActivityBoard::set_mailbox_probe):
// a detached actor, like a rank, that is busy in one message while others arrive shows exactly the
// ones waiting at its next change of state; changes of state made by another thread leave the
// figure as it was (only the actor's own thread may look into its mailbox).
#include <catch2/catch.hpp>
#include <caf/all.hpp>
#include <future>
#include <random>

#include "engine/activity.hpp"

namespace troupe {
namespace {

using busy_atom = caf::atom_constant<caf::atom("mbbusy")>;
using note_atom = caf::atom_constant<caf::atom("mbnote")>;
using done_atom = caf::atom_constant<caf::atom("mbdone")>;

TEST_CASE("mailbox gauge: a busy actor shows the messages queued behind it", "[inspect]") {
  std::mt19937 rng(static_cast<unsigned>(Catch::rngSeed()));
  const int queued = 2 + static_cast<int>(rng() % 9);
  caf::actor_system_config cfg;
  caf::actor_system system{cfg};
  caf::scoped_actor self{system};
  auto board = std::make_shared<ActivityBoard>(0, 0, 0, 0);
  CHECK(board->snapshot().mailbox == -1);  // nothing read yet
  std::promise<void> go, seen;
  auto seen_future = seen.get_future();
  auto actor = system.spawn<caf::detached>([board, g = go.get_future().share(), &seen](caf::event_based_actor* a) {
    board->set_mailbox_probe([a] { return a->mailbox().size(); });
    return caf::behavior{
        // Busy until the test has queued its notes behind this message, then a change of state.
        [board, g, &seen](busy_atom) {
          g.wait();
          board->set(Doing::forward, 1, 0, 0);
          seen.set_value();
        },
        [](note_atom) {},
        // Handled after every note, while the test sends nothing: an empty mailbox.
        [board](done_atom) {
          board->set(Doing::idle);
          return done_atom::value;
        },
    };
  });
  self->send(actor, busy_atom::value);
  for (int i = 0; i < queued; ++i) self->send(actor, note_atom::value);
  // Another thread's change of state does not look into the actor's mailbox.
  board->set(Doing::waiting);
  CHECK(board->snapshot().mailbox == -1);
  go.set_value();
  seen_future.wait();
  const Activity busy = board->snapshot();
  CHECK(busy.doing == Doing::forward);
  CHECK(busy.micro == 1);
  CHECK(busy.mailbox == queued);
  CHECK(busy.describe().find("; " + std::to_string(queued) + " in mailbox)") != std::string::npos);
  self->request(actor, caf::infinite, done_atom::value).receive([](done_atom) {}, [](caf::error&) { FAIL("no answer"); });
  const Activity after = board->snapshot();
  CHECK(after.doing == Doing::idle);
  CHECK(after.mailbox == 0);
  self->send_exit(actor, caf::exit_reason::user_shutdown);
}

}  // namespace
}  // namespace troupe
