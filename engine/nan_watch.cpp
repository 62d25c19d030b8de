#include "engine/nan_watch.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <tuple>

#include <nlohmann/json.hpp>

namespace troupe {

bool NanFinding::before(const NanFinding& o) const {
  if (found != o.found) return found;
  return std::tie(micro_batch, pass, position, op, tp, dp, rank) <
         std::tie(o.micro_batch, o.pass, o.position, o.op, o.tp, o.dp, o.rank);
}

// ---- the finding on the wire --------------------------------------------------------------------

namespace {

constexpr size_t kHeaderWords = 17;
// Text fields: (slot bytes) in this order after the header.
constexpr size_t kTextBytes[] = {200, 64, 64, 64, 128};
static_assert(kHeaderWords * 8 + 200 + 64 + 64 + 64 + 128 <= kNanFindingWords * 8, "a finding fits its words");

std::string first_value_text(double v) {
  if (std::isnan(v)) return "nan";
  return v > 0 ? "inf" : "-inf";
}

}  // namespace

std::vector<int64_t> encode_finding(const NanFinding& f) {
  std::vector<int64_t> w(kNanFindingWords, 0);
  int64_t bits = 0;
  std::memcpy(&bits, &f.first_value, sizeof bits);
  const int64_t head[kHeaderWords] = {f.found,    f.rank,          f.pp,    f.tp,    f.dp,
                                      f.micro_batch, f.pass,       f.position, f.op, f.virtual_stage,
                                      f.chunk,    f.layer,         static_cast<int64_t>(f.dir),
                                      f.non_finite, f.elements,    f.first_index, bits};
  std::copy(head, head + kHeaderWords, w.begin());
  char* text = reinterpret_cast<char*>(w.data() + kHeaderWords);
  const std::string* fields[] = {&f.what, &f.spec, &f.where, &f.tensor, &f.bad_parameter};
  for (size_t i = 0; i < 5; ++i) {
    const size_t n = std::min(fields[i]->size(), kTextBytes[i] - 1);
    std::memcpy(text, fields[i]->data(), n);  // the slot's rest stays zero: the terminator
    text += kTextBytes[i];
  }
  return w;
}

NanFinding decode_finding(const int64_t* w) {
  NanFinding f;
  f.found = w[0] != 0;
  f.rank = static_cast<int>(w[1]);
  f.pp = static_cast<int>(w[2]);
  f.tp = static_cast<int>(w[3]);
  f.dp = static_cast<int>(w[4]);
  f.micro_batch = static_cast<int>(w[5]);
  f.pass = static_cast<int>(w[6]);
  f.position = static_cast<int>(w[7]);
  f.op = w[8];
  f.virtual_stage = static_cast<int>(w[9]);
  f.chunk = static_cast<int>(w[10]);
  f.layer = static_cast<int>(w[11]);
  f.dir = static_cast<ProbeDir>(std::clamp<int64_t>(w[12], 0, 2));
  f.non_finite = w[13];
  f.elements = w[14];
  f.first_index = w[15];
  std::memcpy(&f.first_value, &w[16], sizeof f.first_value);
  const char* text = reinterpret_cast<const char*>(w + kHeaderWords);
  std::string* fields[] = {&f.what, &f.spec, &f.where, &f.tensor, &f.bad_parameter};
  for (size_t i = 0; i < 5; ++i) {
    *fields[i] = std::string(text, strnlen(text, kTextBytes[i] - 1));
    text += kTextBytes[i];
  }
  return f;
}

// ---- the report ---------------------------------------------------------------------------------

NanReport combine_findings(int64_t iteration, const std::string& trigger, std::vector<NanFinding> ranks) {
  NanReport r;
  r.iteration = iteration;
  r.trigger = trigger;
  std::sort(ranks.begin(), ranks.end(), [](const NanFinding& a, const NanFinding& b) { return a.rank < b.rank; });
  for (const NanFinding& f : ranks) {
    if (f.found && (!r.located || f.before(r.origin))) {
      r.origin = f;
      r.located = true;
    }
    if (!f.bad_parameter.empty() && r.bad_parameter_rank < 0) {
      r.bad_parameter = f.bad_parameter;
      r.bad_parameter_rank = f.rank;
    }
  }
  r.ranks = std::move(ranks);
  return r;
}

namespace {
std::string coords(const NanFinding& f) {
  return "rank " + std::to_string(f.rank) + " (pp " + std::to_string(f.pp) + ", tp " + std::to_string(f.tp) + ", dp " +
         std::to_string(f.dp) + ")";
}
}  // namespace

std::string NanReport::message() const {
  std::string m = "the NaN watch stopped the job at iteration " + std::to_string(iteration) + ": " + trigger +
                  " was not finite; ";
  if (located) {
    const NanFinding& o = origin;
    m += "replaying the iteration from its saved inputs, the first non-finite value is " + o.what;
    if (o.pass >= 0) m += std::string(" (") + (o.pass == 0 ? "forward" : "backward") + ")";
    if (o.micro_batch >= 0) m += " of micro-batch " + std::to_string(o.micro_batch);
    m += " on " + coords(o);
    return m;
  }
  m += "the replay of the iteration from its saved inputs found every op finite, so the NaN did not come from the "
       "forward or backward pass (";
  m += bad_parameter.empty() ? "the computation is not deterministic, or it came from outside the checked ops)"
                             : "it came from the optimizer step itself, or the computation is not deterministic)";
  if (!bad_parameter.empty())
    m += "; the first non-finite parameter after the step is " + bad_parameter + " on rank " +
         std::to_string(bad_parameter_rank);
  return m;
}

namespace {
nlohmann::json finding_json(const NanFinding& f) {
  nlohmann::json j = {{"rank", f.rank}, {"pp", f.pp}, {"tp", f.tp}, {"dp", f.dp}, {"found", f.found}};
  if (!f.found) return j;
  j["micro_batch"] = f.micro_batch;
  j["pass"] = f.pass < 0 ? "parameters" : f.pass == 0 ? "forward" : "backward";
  j["virtual_stage"] = f.virtual_stage;
  j["chunk"] = f.chunk;
  j["where"] = f.where;
  j["layer"] = f.layer >= 0 ? nlohmann::json(f.layer) : nlohmann::json(nullptr);
  j["tensor"] = f.tensor;
  j["direction"] = f.spec.empty() ? "input" : probe_dir_name(f.dir);
  j["describe"] = f.what;
  j["spec"] = f.spec;
  j["op_index"] = f.op;
  j["non_finite"] = f.non_finite;
  j["elements"] = f.elements;
  j["first_index"] = f.first_index;
  j["first_value"] = first_value_text(f.first_value);
  return j;
}
}  // namespace

std::string NanReport::to_json() const {
  nlohmann::json j = {{"format", "troupe.nan_report"}, {"version", 1},     {"iteration", iteration},
                      {"trigger", trigger},            {"located", located}, {"message", message()}};
  j["origin"] = located ? finding_json(origin) : nlohmann::json(nullptr);
  j["first_non_finite_parameter"] =
      bad_parameter.empty() ? nlohmann::json(nullptr)
                            : nlohmann::json{{"name", bad_parameter}, {"rank", bad_parameter_rank}};
  nlohmann::json list = nlohmann::json::array();
  for (const NanFinding& f : ranks) list.push_back(finding_json(f));
  j["ranks"] = list;
  return j.dump(1) + "\n";
}

// ---- the control ----------------------------------------------------------------------------------

void NanControl::set_report_file(std::string path) {
  std::lock_guard<std::mutex> lock(mu_);
  file_ = std::move(path);
}

std::string NanControl::report_file() const {
  std::lock_guard<std::mutex> lock(mu_);
  return file_;
}

void NanControl::set_report(const NanReport& report) {
  std::lock_guard<std::mutex> lock(mu_);
  if (report_) return;
  report_ = report;
  if (file_.empty()) return;
  const std::string json = report.to_json();
  std::error_code ec;
  if (const auto parent = std::filesystem::path(file_).parent_path(); !parent.empty())
    std::filesystem::create_directories(parent, ec);
  FILE* f = std::fopen(file_.c_str(), "w");
  const bool ok = f != nullptr && std::fwrite(json.data(), 1, json.size(), f) == json.size();
  if ((f != nullptr && std::fclose(f) != 0) || !ok) file_error_ = "could not write " + file_;
}

std::optional<NanReport> NanControl::report() const {
  std::lock_guard<std::mutex> lock(mu_);
  return report_;
}

std::string NanControl::report_file_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return file_error_;
}

// ---- the probe ------------------------------------------------------------------------------------

void poison(const Tensor& given) {
  if (!given.defined() || given.numel() == 0) return;
  if (given.device() != Device::cpu) {  // a GPU rank's tensor: its first element through the host
    const Tensor first = given.view({given.numel()}).rows(0, 1);
    const Tensor host = first.to_host();
    poison(host);
    first.copy_from(host);
    return;
  }
  const Tensor& t = given;
  if (t.dtype() == DType::f32) t.data<float>()[0] = std::numeric_limits<float>::quiet_NaN();
  if (t.dtype() == DType::f64) t.data<double>()[0] = std::numeric_limits<double>::quiet_NaN();
  if (is_16bit(t.dtype())) t.data<uint16_t>()[0] = t.dtype() == DType::bf16 ? 0x7fc0 : 0x7e00;  // a quiet NaN
}

void WatchProbe::at(int micro_batch, int chunk, int virtual_stage, int pass, int position) {
  micro_ = micro_batch;
  chunk_ = chunk;
  vstage_ = virtual_stage;
  pass_ = pass;
  position_ = position;
  op_ = 0;
}

void WatchProbe::start_checking(const NanFinding& who) {
  finding_ = who;
  finding_.found = false;
  checking_ = true;
}

NanFinding WatchProbe::stop_checking() {
  checking_ = false;
  return finding_;
}

void WatchProbe::note(const Tensor& t, int64_t bad, const std::string& what, const ProbePoint* at) {
  finding_.found = true;
  finding_.micro_batch = micro_;
  finding_.pass = pass_;
  finding_.position = position_;
  finding_.op = at ? op_ : -1;
  finding_.virtual_stage = vstage_;
  finding_.chunk = chunk_;
  finding_.what = what;
  finding_.non_finite = count_non_finite(t);
  finding_.elements = t.numel();
  finding_.first_index = bad;
  // The element alone, widened exactly (through the host for a GPU rank's tensor).
  finding_.first_value = t.view({t.numel()}).rows(bad, bad + 1).to(DType::f64).data<double>()[0];
  if (at != nullptr) {
    finding_.layer = at->layer;
    finding_.dir = at->dir;
    finding_.spec = probe_id(*at);
    finding_.where = probe_where(*at);
    finding_.tensor = at->tensor;
  } else {
    finding_.layer = -1;
    finding_.where = what;
  }
}

void WatchProbe::check_input(const Tensor& t, const std::string& what) {
  if (!checking_ || finding_.found) return;
  if (const int64_t bad = first_non_finite(t); bad >= 0) note(t, bad, what, nullptr);
}

void WatchProbe::after(const ProbePoint& at, const Tensor& result) {
  if (fault_ && iteration_ == fault_->iteration && micro_ == fault_->micro_batch && fault_->matches(at)) poison(result);
  if (!checking_) return;
  if (!finding_.found)
    if (const int64_t bad = first_non_finite(result); bad >= 0) note(result, bad, describe(at), &at);
  ++op_;
}

}  // namespace troupe
