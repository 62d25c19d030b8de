// serve/request.hpp.
#include "serve/request.hpp"

#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace troupe {

namespace {

constexpr size_t kMaxPrompts = 128;

Result<nlohmann::json> object_of(std::string_view body) {
  nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::bad_input("the body is not JSON -- send a JSON object");
  if (!j.is_object()) return Status::bad_input("the body is not a JSON object -- send {\"prompts\": [...], ...}");
  return j;
}

bool is_int(const nlohmann::json& v) { return v.is_number_integer() || v.is_number_unsigned(); }

// A JSON integer within [lo, hi] into `out`; false when it is not one.
bool int_in(const nlohmann::json& v, int64_t lo, int64_t hi, int64_t& out) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(hi)) return false;
    out = static_cast<int64_t>(u);
    return out >= lo;
  }
  if (!v.is_number_integer()) return false;
  out = v.get<int64_t>();
  return out >= lo && out <= hi;
}

}  // namespace

Result<ServeRequest> parse_megatron_request(std::string_view body) {
  auto parsed = object_of(body);
  if (!parsed) return parsed.status();
  const nlohmann::json& j = parsed.value();
  ServeRequest r;
  r.api = ServeRequest::Api::megatron;
  auto bad = [](const std::string& why) { return Status::bad_input(why); };
  if (!j.contains("prompts")) return bad("prompts argument required");
  if (j.contains("max_len")) return bad("max_len is no longer used.  Replace with tokens_to_generate");
  if (j.contains("sentences")) return bad("sentences is no longer used.  Replace with prompts");
  const nlohmann::json& prompts = j["prompts"];
  if (!prompts.is_array()) return bad("prompts is not a list of strings");
  if (prompts.empty()) return bad("prompts is empty");
  if (prompts.size() > kMaxPrompts) return bad("Maximum number of prompts is 128");
  for (const nlohmann::json& p : prompts) {
    if (!p.is_string()) return bad("prompts is not a list of strings");
    r.prompts.push_back(p.get<std::string>());
  }
  int64_t v = 0;
  if (j.contains("tokens_to_generate")) {
    if (!int_in(j["tokens_to_generate"], 0, 1 << 20, v))
      return bad("tokens_to_generate must be an integer greater than or equal to 0");
    r.tokens_to_generate = static_cast<int>(v);
  }
  if (j.contains("logprobs")) {
    if (!j["logprobs"].is_boolean()) return bad("logprobs must be a boolean value");
    r.logprobs = j["logprobs"].get<bool>();
  }
  if (r.tokens_to_generate == 0 && !r.logprobs) return bad("tokens_to_generate=0 implies logprobs should be True");
  if (j.contains("temperature")) {
    const nlohmann::json& t = j["temperature"];
    if (!t.is_number()) return bad("temperature must be a positive number less than or equal to 100.0");
    r.sampling.temperature = t.get<double>();
    if (!(r.sampling.temperature > 0 && r.sampling.temperature <= 100))
      return bad("temperature must be a positive number less than or equal to 100.0");
  }
  if (j.contains("top_k")) {
    if (!int_in(j["top_k"], 0, 1000, v))
      return bad("top_k must be an integer equal to or greater than 0 and less than or equal to 1000");
    r.sampling.top_k = static_cast<int>(v);
  }
  if (j.contains("top_p")) {
    const nlohmann::json& p = j["top_p"];
    if (!p.is_number_float()) return bad("top_p must be a positive float less than or equal to 1.0");
    r.sampling.top_p = p.get<double>();
    if (r.sampling.top_p > 0 && r.sampling.top_k > 0) return bad("cannot set both top-k and top-p samplings.");
    if (!(r.sampling.top_p >= 0 && r.sampling.top_p <= 1)) return bad("top_p must be less than or equal to 1.0");
  }
  for (const char* unsupported : {"top_p_decay", "top_p_bound"})
    if (j.contains(unsupported))
      return bad(std::string(unsupported) + " is not supported by troupe serve -- leave it out (plain top_p sampling)");
  auto flag = [&](const char* name, bool& out) -> Status {
    if (!j.contains(name)) return Status::ok();
    if (!j[name].is_boolean()) return bad(std::string(name) + " must be a boolean value");
    out = j[name].get<bool>();
    return Status::ok();
  };
  bool no_log = false, prevent_newline = false;
  TROUPE_RETURN_IF_ERROR(flag("add_BOS", r.add_bos));
  TROUPE_RETURN_IF_ERROR(flag("stop_on_double_eol", r.stop_on_double_eol));
  TROUPE_RETURN_IF_ERROR(flag("stop_on_eol", r.stop_on_eol));
  TROUPE_RETURN_IF_ERROR(flag("prevent_newline_after_colon", prevent_newline));
  TROUPE_RETURN_IF_ERROR(flag("no_log", no_log));
  if (prevent_newline) return bad("prevent_newline_after_colon is not supported by troupe serve -- leave it out");
  for (const std::string& p : r.prompts)
    if (p.empty() && !r.add_bos) return bad("Empty prompts require add_BOS=true");
  if (j.contains("random_seed")) {
    if (!is_int(j["random_seed"])) return bad("random_seed must be integer");
    if (!int_in(j["random_seed"], 0, INT64_MAX, v)) return bad("random_seed must be a positive integer");
    r.sampling.seed = static_cast<uint64_t>(v);
    r.seeded = true;
  }
  if (j.contains("beam_width")) {
    if (!is_int(j["beam_width"])) return bad("beam_width must be integer");
    if (!int_in(j["beam_width"], 1, 128, v)) return bad("beam_width must be an integer > 1");
    if (r.prompts.size() > 1) return bad("When doing beam_search, batch size must be 1");
    r.beam_width = static_cast<int>(v);
  }
  if (j.contains("stop_token")) {
    if (!int_in(j["stop_token"], 0, INT32_MAX, v)) return bad("stop_token must be an integer");
    r.has_stop_token = true;
    r.stop_token = static_cast<int32_t>(v);
  }
  if (j.contains("length_penalty")) {
    if (!j["length_penalty"].is_number_float()) return bad("length_penalty must be a float");
    r.length_penalty = j["length_penalty"].get<double>();
    if (!std::isfinite(r.length_penalty) || std::abs(r.length_penalty) > 100)
      return bad("length_penalty must be a float in [-100, 100]");
  }
  return r;
}

Result<ServeRequest> parse_completions_request(std::string_view body) {
  auto parsed = object_of(body);
  if (!parsed) return parsed.status();
  const nlohmann::json& j = parsed.value();
  ServeRequest r;
  r.api = ServeRequest::Api::completions;
  r.tokens_to_generate = 16;
  auto bad = [](const std::string& why) { return Status::bad_input(why); };
  if (!j.contains("prompt")) return bad("prompt is required -- send {\"prompt\": \"...\"}");
  const nlohmann::json& p = j["prompt"];
  if (p.is_string()) {
    r.prompts.push_back(p.get<std::string>());
  } else if (p.is_array() && !p.empty() && p.size() <= kMaxPrompts) {
    for (const nlohmann::json& s : p) {
      if (!s.is_string()) return bad("prompt must be a string or a list of strings");
      r.prompts.push_back(s.get<std::string>());
    }
  } else {
    return bad("prompt must be a string or a list of 1 to 128 strings");
  }
  for (const std::string& s : r.prompts)
    if (s.empty()) return bad("a prompt is empty -- give it some text");
  int64_t v = 0;
  if (j.contains("max_tokens") && !j["max_tokens"].is_null()) {
    if (!int_in(j["max_tokens"], 0, 1 << 20, v)) return bad("max_tokens must be an integer >= 0");
    r.tokens_to_generate = static_cast<int>(v);
  }
  if (j.contains("temperature") && !j["temperature"].is_null()) {
    if (!j["temperature"].is_number()) return bad("temperature must be a number in [0, 2]");
    const double t = j["temperature"].get<double>();
    if (!(t >= 0 && t <= 2)) return bad("temperature must be a number in [0, 2]");
    if (t == 0) r.sampling.top_k = 1;  // OpenAI's temperature 0: the most likely token
    else r.sampling.temperature = t;
  }
  if (j.contains("top_p") && !j["top_p"].is_null()) {
    if (!j["top_p"].is_number()) return bad("top_p must be a number in (0, 1]");
    const double tp = j["top_p"].get<double>();
    if (!(tp > 0 && tp <= 1)) return bad("top_p must be a number in (0, 1]");
    if (tp < 1 && r.sampling.top_k != 1) r.sampling.top_p = tp;  // 1: the whole distribution
  }
  if (j.contains("top_k") && !j["top_k"].is_null()) {
    if (!int_in(j["top_k"], 0, 1000, v)) return bad("top_k must be an integer in [0, 1000]");
    if (v > 0 && r.sampling.top_p > 0) return bad("top_k and top_p are both set -- give one of them");
    if (r.sampling.top_k != 1) r.sampling.top_k = static_cast<int>(v);
  }
  if (j.contains("stop") && !j["stop"].is_null()) {
    const nlohmann::json& s = j["stop"];
    if (s.is_string()) {
      r.stop.push_back(s.get<std::string>());
    } else if (s.is_array() && s.size() <= 4) {
      for (const nlohmann::json& x : s) {
        if (!x.is_string()) return bad("stop must be a string or a list of up to 4 strings");
        r.stop.push_back(x.get<std::string>());
      }
    } else {
      return bad("stop must be a string or a list of up to 4 strings");
    }
    for (const std::string& x : r.stop)
      if (x.empty()) return bad("a stop string is empty -- leave it out");
  }
  if (j.contains("stream") && !j["stream"].is_null()) {
    if (!j["stream"].is_boolean()) return bad("stream must be a boolean");
    r.stream = j["stream"].get<bool>();
  }
  if (j.contains("stream_options") && !j["stream_options"].is_null()) {
    const nlohmann::json& so = j["stream_options"];
    if (!so.is_object()) return bad("stream_options must be an object such as {\"include_usage\": true}");
    if (!r.stream) return bad("stream_options is only allowed when stream is true");
    if (so.contains("include_usage") && !so["include_usage"].is_null()) {
      if (!so["include_usage"].is_boolean()) return bad("stream_options.include_usage must be a boolean");
      r.include_usage = so["include_usage"].get<bool>();
    }
  }
  if (j.contains("echo") && !j["echo"].is_null()) {
    if (!j["echo"].is_boolean()) return bad("echo must be a boolean");
    r.echo = j["echo"].get<bool>();
  }
  if (j.contains("logprobs") && !j["logprobs"].is_null()) {
    if (!int_in(j["logprobs"], 0, 5, v)) return bad("logprobs must be null or an integer in [0, 5]");
    r.logprobs = true;
  }
  if (j.contains("seed") && !j["seed"].is_null()) {
    if (!int_in(j["seed"], 0, INT64_MAX, v)) return bad("seed must be an integer >= 0");
    r.sampling.seed = static_cast<uint64_t>(v);
    r.seeded = true;
  }
  if (j.contains("n") && !j["n"].is_null()) {
    if (!int_in(j["n"], 1, 1, v)) return bad("n must be 1 -- troupe serve returns one completion per prompt");
  }
  if (j.contains("best_of") && !j["best_of"].is_null() && !int_in(j["best_of"], 1, 1, v))
    return bad("best_of must be 1 -- beam search is not supported yet");
  if (j.contains("model") && j["model"].is_string()) r.model = j["model"].get<std::string>().substr(0, 256);
  return r;
}

}  // namespace troupe
