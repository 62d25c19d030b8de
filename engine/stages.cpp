#include "engine/stages.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

namespace troupe {

using nlohmann::json;

namespace {

// Unit costs: a backward twice a forward; split in two equal halves when the table has W passes.
struct Costs {
  double f, b, w;
};
Costs unit_costs(const sched::Schedule& sc) { return sc.split_backward ? Costs{1, 1, 1} : Costs{1, 2, 0}; }

// part / whole within [0, 1]: a rank's own spans lie inside its step, so more than the whole only
// comes from a document another process sent that does not hold together (fuzz finding: a span of
// 2.5e53 us in a step of 10 ms); its busy share is then all of the step, not 1e49.
double share(double part, double whole) { return whole > 0 ? std::clamp(part / whole, 0.0, 1.0) : 0; }

json schedule_object(const sched::Schedule& sc, bool given_as_data) {
  return {{"name", given_as_data ? std::string("given as data") : std::string(sched::schedule_name(sc.spec.type))},
          {"stages", sc.spec.stages},
          {"micro_batches", sc.spec.micro_batches},
          {"chunks", sc.spec.chunks},
          {"split_backward", sc.split_backward}};
}

json prediction_object(const BubblePrediction& p) {
  json j = {{"bubble", p.bubble}, {"per_stage", p.per_stage}, {"method", p.method}};
  j["formula"] = p.formula >= 0 ? json(p.formula) : json(nullptr);
  j["at_measured_costs"] = p.at_measured_costs >= 0 ? json(p.at_measured_costs) : json(nullptr);
  return j;
}

json span_array(const StepSpan& s) {
  return json::array({span_kind_name(s.kind), s.micro, s.chunk, s.start_us, s.dur_us});
}

}  // namespace

BubblePrediction predict_bubble(const sched::Schedule& sc, bool given_as_data, double f_ms, double b_ms, double w_ms) {
  BubblePrediction p;
  const Costs unit = unit_costs(sc);
  const sched::SimResult r = sched::simulate(sc, unit.f, unit.b, unit.w);
  p.bubble = r.bubble;
  for (double busy : r.busy) p.per_stage.push_back(r.makespan > 0 ? 1 - busy / r.makespan : 0);
  if (!given_as_data) p.formula = sched::theoretical_bubble(sc.spec, unit.f, unit.b, unit.w);
  const bool measured = f_ms > 0 && b_ms > 0 && (!sc.split_backward || w_ms > 0);
  if (measured) p.at_measured_costs = sched::simulate(sc, f_ms, b_ms, sc.split_backward ? w_ms : 0).bubble;
  p.method = std::string("the schedule's table simulated with ") +
             (sc.split_backward ? "F = B = W = 1" : "F = 1, B = 2") +
             " (communication free); per stage 1 - busy / makespan" +
             (given_as_data ? "" : "; formula: " + std::string(sched::schedule_name(sc.spec.type)) + "'s") +
             (measured ? "; at_measured_costs: the same table with the mean measured F, B, W" : "");
  return p;
}

StagesReport stage_figures(const std::vector<RankSteps>& ranks, const sched::Schedule& schedule, bool given_as_data,
                           int last) {
  StagesReport out;
  // The iterations every rank completed, the last `last` of them.
  std::set<int64_t> common;
  for (size_t i = 0; i < ranks.size(); ++i) {
    std::set<int64_t> mine;
    for (const StepRecord& s : ranks[i].steps) mine.insert(s.iteration);
    if (i == 0) {
      common = std::move(mine);
    } else {
      std::set<int64_t> both;
      std::set_intersection(common.begin(), common.end(), mine.begin(), mine.end(), std::inserter(both, both.end()));
      common = std::move(both);
    }
  }
  std::vector<int64_t> its(common.begin(), common.end());
  if (static_cast<int>(its.size()) > last) its.erase(its.begin(), its.end() - std::max(last, 0));
  out.iterations = its;

  // Each rank's step of each counted iteration (the last record of that iteration, should a rank
  // have two).
  auto step_of = [&](const RankSteps& r, int64_t it) -> const StepRecord* {
    const StepRecord* found = nullptr;
    for (const StepRecord& s : r.steps)
      if (s.iteration == it) found = &s;
    return found;
  };
  std::map<int64_t, double> makespan_us;
  for (int64_t it : its)
    for (const RankSteps& r : ranks)
      if (const StepRecord* s = step_of(r, it))
        for (const StepSpan& sp : s->spans)
          if (computes(sp.kind)) makespan_us[it] = std::max(makespan_us[it], sp.start_us + sp.dur_us);

  double job_compute = 0, job_makespan = 0;
  double pass_us[3] = {0, 0, 0};
  int passes[3] = {0, 0, 0};
  const BubblePrediction unit = predict_bubble(schedule, given_as_data);
  for (const RankSteps& r : ranks) {
    RankFigures rf;
    rf.rank = r.rank;
    rf.stage = r.stage;
    rf.tp = r.tp;
    rf.dp = r.dp;
    rf.cp = r.cp;
    if (r.stage >= 0 && r.stage < static_cast<int>(unit.per_stage.size())) rf.predicted_bubble = unit.per_stage[r.stage];
    double compute_us = 0, step_us = 0, span_us = 0;
    for (int64_t it : its) {
      const StepRecord* s = step_of(r, it);
      if (s == nullptr) continue;
      StepFigures f;
      f.iteration = it;
      f.step_ms = s->dur_us / 1e3;
      f.makespan_ms = makespan_us[it] / 1e3;
      for (const StepSpan& sp : s->spans) {
        const double ms = sp.dur_us / 1e3;
        switch (sp.kind) {
          case SpanKind::forward: f.f_ms += ms, ++f.f; break;
          case SpanKind::backward: f.b_ms += ms, ++f.b; break;
          case SpanKind::weight: f.w_ms += ms, ++f.w; break;
          case SpanKind::wait: f.wait_ms += ms; break;
          case SpanKind::reduce: f.reduce_ms += ms; break;
          case SpanKind::optimizer: f.optimizer_ms += ms; break;
        }
      }
      const double compute_ms = f.f_ms + f.b_ms + f.w_ms;
      f.busy = share(compute_ms, f.step_ms);
      f.bubble = f.makespan_ms > 0 ? 1 - compute_ms / f.makespan_ms : 0;
      compute_us += compute_ms * 1e3;
      step_us += s->dur_us;
      span_us += makespan_us[it];
      pass_us[0] += f.f_ms * 1e3, passes[0] += f.f;
      pass_us[1] += f.b_ms * 1e3, passes[1] += f.b;
      pass_us[2] += f.w_ms * 1e3, passes[2] += f.w;
      rf.step_ms += f.step_ms, rf.f_ms += f.f_ms, rf.b_ms += f.b_ms, rf.w_ms += f.w_ms;
      rf.wait_ms += f.wait_ms, rf.reduce_ms += f.reduce_ms, rf.optimizer_ms += f.optimizer_ms;
      rf.steps.push_back(f);
    }
    if (const double n = static_cast<double>(rf.steps.size()); n > 0) {
      for (double* m : {&rf.step_ms, &rf.f_ms, &rf.b_ms, &rf.w_ms, &rf.wait_ms, &rf.reduce_ms, &rf.optimizer_ms})
        *m /= n;
    }
    rf.busy = share(compute_us, step_us);
    rf.idle = rf.steps.empty() ? 0 : 1 - rf.busy;
    rf.bubble = span_us > 0 ? 1 - compute_us / span_us : 0;
    job_compute += compute_us;
    job_makespan += span_us;
    out.ranks.push_back(std::move(rf));
  }
  std::sort(out.ranks.begin(), out.ranks.end(), [](const RankFigures& a, const RankFigures& b) { return a.rank < b.rank; });
  out.bubble = job_makespan > 0 ? 1 - job_compute / job_makespan : 0;
  out.f_ms = passes[0] ? pass_us[0] / passes[0] / 1e3 : 0;
  out.b_ms = passes[1] ? pass_us[1] / passes[1] / 1e3 : 0;
  out.w_ms = passes[2] ? pass_us[2] / passes[2] / 1e3 : 0;
  out.predicted = predict_bubble(schedule, given_as_data, out.f_ms, out.b_ms, out.w_ms);
  return out;
}

std::string rank_steps_json(const std::vector<RankSteps>& ranks) {
  json list = json::array();
  for (const RankSteps& r : ranks) {
    json steps = json::array();
    for (const StepRecord& s : r.steps) {
      json spans = json::array();
      for (const StepSpan& sp : s.spans) spans.push_back(span_array(sp));
      steps.push_back({{"iteration", s.iteration}, {"start_us", s.start_us}, {"dur_us", s.dur_us}, {"spans", spans}});
    }
    json one = {{"rank", r.rank}, {"pp", r.stage}, {"tp", r.tp}, {"dp", r.dp}, {"steps", steps}};
    if (r.cp >= 0) one["cp"] = r.cp;
    list.push_back(std::move(one));
  }
  return json{{"ranks", list}}.dump() + "\n";
}

Result<std::vector<RankSteps>> rank_steps_from_json(const std::string& text) {
  const auto j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("ranks") || !j["ranks"].is_array())
    return Status::error("not a stages document (no \"ranks\" array)");
  auto finite = [](const json& v) { return v.is_number() && std::isfinite(v.get<double>()); };
  auto small_int = [](const json& v, int64_t lo, int64_t hi) {
    return v.is_number_integer() && v.get<int64_t>() >= lo && v.get<int64_t>() <= hi;
  };
  constexpr int64_t kMaxIndex = int64_t{1} << 30;
  std::vector<RankSteps> out;
  size_t total = 0;
  try {
    for (const json& r : j["ranks"]) {
      RankSteps rs;
      for (const char* key : {"rank", "pp", "tp", "dp"})
        if (!small_int(r.at(key), 0, kMaxIndex)) return Status::error(std::string("a rank's \"") + key + "\" is not a rank index");
      rs.rank = r["rank"].get<int>();
      rs.stage = r["pp"].get<int>();
      rs.tp = r["tp"].get<int>();
      rs.dp = r["dp"].get<int>();
      if (r.contains("cp")) {
        if (!small_int(r["cp"], 0, kMaxIndex)) return Status::error("a rank's \"cp\" is not a rank index");
        rs.cp = r["cp"].get<int>();
      }
      for (const json& s : r.at("steps")) {
        StepRecord rec;
        if (!small_int(s.at("iteration"), 0, INT64_MAX)) return Status::error("a step's \"iteration\" is not a count");
        if (!finite(s.at("start_us")) || !finite(s.at("dur_us")) || s["dur_us"].get<double>() < 0)
          return Status::error("a step's start_us or dur_us is not a finite time (dur_us >= 0)");
        rec.iteration = s["iteration"].get<int64_t>();
        rec.start_us = s["start_us"].get<double>();
        rec.dur_us = s["dur_us"].get<double>();
        const json& spans = s.at("spans");
        if (!spans.is_array()) return Status::error("a step's \"spans\" is not an array");
        total += spans.size();
        if (total > kMaxPeerSpans) return Status::error("more than 2^20 spans");
        for (const json& sp : spans) {
          if (!sp.is_array() || sp.size() != 5 || !sp[0].is_string())
            return Status::error("a span is not [kind, micro, chunk, start_us, dur_us]");
          const auto kind = span_kind_from_name(sp[0].get<std::string>());
          if (!kind) return Status::error("a span's kind \"" + sp[0].get<std::string>().substr(0, 32) + "\" is unknown");
          if (!small_int(sp[1], -1, kMaxIndex) || !small_int(sp[2], -1, kMaxIndex))
            return Status::error("a span's micro-batch or chunk is not -1 or an index");
          if (!finite(sp[3]) || !finite(sp[4]) || sp[4].get<double>() < 0)
            return Status::error("a span's start_us or dur_us is not a finite time (dur_us >= 0)");
          rec.spans.push_back({*kind, sp[1].get<int32_t>(), sp[2].get<int32_t>(), sp[3].get<double>(), sp[4].get<double>()});
        }
        rs.steps.push_back(std::move(rec));
      }
      out.push_back(std::move(rs));
    }
  } catch (const json::exception&) {
    return Status::error("a malformed stages document: a rank or step lacks a field, or has one of the wrong type");
  }
  return out;
}

std::string stages_json(const StagesReport& report, const sched::Schedule& schedule, bool given_as_data,
                        const std::vector<RankSteps>& ranks, int spans_of) {
  json j;
  j["iterations"] = report.iterations;
  j["schedule"] = schedule_object(schedule, given_as_data);
  j["predicted"] = prediction_object(report.predicted);
  j["bubble"] = report.bubble;
  j["pass_ms"] = {{"F", report.f_ms}, {"B", report.b_ms}, {"W", report.w_ms}};
  j["ranks"] = json::array();
  for (const RankFigures& r : report.ranks) {
    const RankSteps* raw = nullptr;
    for (const RankSteps& x : ranks)
      if (x.rank == r.rank) raw = &x;
    json steps = json::array();
    for (const StepFigures& f : r.steps) {
      json s = {{"iteration", f.iteration}, {"step_ms", f.step_ms}, {"makespan_ms", f.makespan_ms},
                {"busy", f.busy},           {"bubble", f.bubble},   {"f_ms", f.f_ms},
                {"b_ms", f.b_ms},           {"w_ms", f.w_ms},       {"wait_ms", f.wait_ms},
                {"reduce_ms", f.reduce_ms}, {"optimizer_ms", f.optimizer_ms},
                {"F", f.f},                 {"B", f.b},             {"W", f.w}};
      const auto from_end = report.iterations.end() - std::find(report.iterations.begin(), report.iterations.end(), f.iteration);
      if (from_end <= spans_of && raw != nullptr) {
        json list = json::array();
        for (const StepRecord& rec : raw->steps)
          if (rec.iteration == f.iteration) {
            list = json::array();
            for (const StepSpan& sp : rec.spans) list.push_back(span_array(sp));
          }
        s["spans"] = list;
      }
      steps.push_back(std::move(s));
    }
    json one = {{"rank", r.rank},
                          {"pp", r.stage},
                          {"tp", r.tp},
                          {"dp", r.dp},
                          {"busy", r.busy},
                          {"idle", r.idle},
                          {"bubble", r.bubble},
                          {"predicted_bubble", r.predicted_bubble},
                          {"step_ms", r.step_ms},
                          {"f_ms", r.f_ms},
                          {"b_ms", r.b_ms},
                          {"w_ms", r.w_ms},
                          {"wait_ms", r.wait_ms},
                          {"reduce_ms", r.reduce_ms},
                          {"optimizer_ms", r.optimizer_ms},
                          {"steps", steps}};
    if (r.cp >= 0) one["cp"] = r.cp;
    j["ranks"].push_back(std::move(one));
  }
  return j.dump(1) + "\n";
}

std::string plan_json(const sched::Schedule& sc, bool given_as_data, const std::vector<Activity>& ranks, int only_rank) {
  const Costs unit = unit_costs(sc);
  const sched::SimResult sim = sched::simulate(sc, unit.f, unit.b, unit.w);
  int only_stage = -1;
  for (const Activity& a : ranks)
    if (a.rank == only_rank) only_stage = a.stage;
  json j;
  j["schedule"] = schedule_object(sc, given_as_data);
  j["predicted"] = prediction_object(predict_bubble(sc, given_as_data));
  j["makespan"] = sim.makespan;
  j["stages"] = json::array();
  for (int s = 0; s < static_cast<int>(sc.stages.size()); ++s) {
    if (only_rank >= 0 && s != only_stage) continue;
    json actions = json::array();
    for (size_t k = 0; k < sc.stages[s].size(); ++k) {
      const sched::Action& a = sc.stages[s][k];
      const double cost = a.kind == sched::Kind::forward ? unit.f : a.kind == sched::Kind::backward ? unit.b : unit.w;
      actions.push_back({{"index", k},
                         {"kind", sched::kind_name(a.kind)},
                         {"micro", a.micro},
                         {"chunk", a.chunk},
                         {"start", sim.start[s][k]},
                         {"end", sim.start[s][k] + cost}});
    }
    json at = json::array();
    for (const Activity& a : ranks) {
      if (a.stage != s || (only_rank >= 0 && a.rank != only_rank)) continue;
      json one = {{"rank", a.rank}, {"tp", a.tp}, {"dp", a.dp}, {"step", a.step}, {"action", a.action},
                  {"doing", doing_name(a.doing)}, {"describe", a.describe()}};
      if (a.cp >= 0) one["cp"] = a.cp;
      at.push_back(std::move(one));
    }
    j["stages"].push_back({{"stage", s}, {"actions", actions}, {"at", at}});
  }
  return j.dump(1) + "\n";
}

}  // namespace troupe
