// troupe's CAF error category: a recoverable failure inside an actor travels to whoever asked as a
// caf::error carrying the user-facing message of the Status (never as an exception).
#pragma once
#include <exception>
#include <string>

#include <caf/all.hpp>

#include "troupe/status.hpp"

namespace troupe {

enum class ActorErrc : uint8_t {
  failed = 1,      // a Status error (I/O, bad data, bad checkpoint): the message says what and how to fix
  diverged = 2,    // the loss or gradient norm became non-finite
  stopped = 3,     // the job was asked to stop
  bad_input = 4,   // a Status::bad_input error (a checkpoint or config the user must change)
};

caf::error make_actor_error(ActorErrc code, std::string message);
inline caf::error to_caf_error(const Status& s) {
  return make_actor_error(s.is_bad_input() ? ActorErrc::bad_input : ActorErrc::failed, s.message());
}
// The user-facing text of any caf::error (troupe's message, or CAF's own rendering).
std::string describe(const caf::error& err);
// The Status a caf::error stands for: its message, and bad input when it carried ActorErrc::bad_input.
Status to_status(const caf::error& err);

// The error an actor ends with when one of its handlers throws: "<who> failed: <exception type>:
// <what>". Installed by name_exceptions on every troupe actor, so the supervisors (the group, the
// trainer, the job) report which actor failed and why, instead of CAF's anonymous runtime_error.
caf::error exception_error(const std::string& who, std::exception_ptr& e);
template <class Self>
void name_exceptions(Self* self, std::string who) {
  self->set_exception_handler(
      [who = std::move(who)](std::exception_ptr& e) -> caf::error { return exception_error(who, e); });
}

}  // namespace troupe
