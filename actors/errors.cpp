#include "actors/errors.hpp"

#include <cxxabi.h>

#include <cstdlib>
#include <memory>
#include <typeinfo>

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

Status to_status(const caf::error& err) {
  if (!err) return Status::ok();
  Status st = Status::error(describe(err));
  if (err.category() == kCategory && err.code() == static_cast<uint8_t>(ActorErrc::bad_input)) return st.as_bad_input();
  return st;
}

caf::error exception_error(const std::string& who, std::exception_ptr& e) {
  std::string what = "an unknown exception";
  try {
    if (e) std::rethrow_exception(e);
  } catch (const std::exception& x) {
    int status = 0;
    std::unique_ptr<char, void (*)(void*)> name(abi::__cxa_demangle(typeid(x).name(), nullptr, nullptr, &status),
                                                std::free);
    what = std::string(status == 0 && name ? name.get() : typeid(x).name()) + ": " + x.what();
  } catch (...) {
  }
  return make_actor_error(ActorErrc::failed, who + " failed: " + what);
}

}  // namespace troupe
