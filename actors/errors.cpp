#include "actors/errors.hpp"

namespace troupe {

namespace {
constexpr caf::atom_value kCategory = caf::atom("troupe");
}

caf::error make_actor_error(ActorErrc code, std::string message) {
  return caf::error(static_cast<uint8_t>(code), kCategory, caf::make_message(std::move(message)));
}

std::string describe(const caf::error& err) {
  if (!err) return "no error";
  if (err.category() == kCategory && err.context().match_elements<std::string>())
    return err.context().get_as<std::string>(0);
  if (err.category() == caf::atom("exit")) {
    const auto reason = static_cast<caf::exit_reason>(err.code());
    return std::string("actor exited: ") + caf::to_string(reason);
  }
  return caf::to_string(err);
}

}  // namespace troupe
