#include "inspect/inspect_stages.hpp"

#include <algorithm>
#include <limits>
#include <optional>
#include <string>

#include "engine/stages.hpp"

namespace troupe {

namespace {

constexpr int kDefaultLast = 8;
constexpr int kMaxLast = 16;

std::optional<int64_t> parse_count(const std::string& word, int64_t lo, int64_t hi) {
  if (word.empty() || word.size() > 18 || word.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  const int64_t v = std::stoll(word);
  if (v < lo || v > hi) return std::nullopt;
  return v;
}

// Flags of the form --name VALUE (numbers) and --name; an unknown word is an error naming the usage.
struct Args {
  std::string error;
  std::optional<int64_t> number(const std::vector<std::string>& args, size_t& i, int64_t lo, int64_t hi,
                                const std::string& usage) {
    const std::string flag = args[i];
    if (i + 1 >= args.size()) {
      error = flag + " needs a value -- " + usage;
      return std::nullopt;
    }
    auto v = parse_count(args[++i], lo, hi);
    if (!v)
      error = flag + " takes a whole number from " + std::to_string(lo) + " to " + std::to_string(hi) + ", got \"" +
              args[i].substr(0, 32) + "\" -- " + usage;
    return v;
  }
};

std::vector<RankSteps> local_steps(const StageSources& src, int last, int64_t since = -1) {
  std::vector<RankSteps> out;
  for (const auto& board : src.boards) {
    const Activity a = board->snapshot();
    RankSteps r;
    r.rank = a.rank;
    r.stage = a.stage;
    r.tp = a.tp;
    r.dp = a.dp;
    r.cp = a.cp;
    r.steps = board->recent().snapshot(last, since);
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace

void add_stage_commands(InspectHub& hub, StageSources sources) {
  auto src = std::make_shared<const StageSources>(std::move(sources));
  InspectHub* h = &hub;
  const std::string stages_usage = "usage: stages [--last N] [--spans N]";
  hub.add("stages", "stages [--last N] [--spans N]",
          "per rank over the last N iterations (default 8): busy, idle and bubble shares, F/B/W ms, beside the "
          "bubble the schedule predicts",
          [src, h, stages_usage](const InspectCall& call) {
            int last = kDefaultLast;
            int64_t since = -1;
            int spans = 0;
            Args parse;
            for (size_t i = 0; i < call.args.size(); ++i) {
              if (call.args[i] == "--last") {
                auto v = parse.number(call.args, i, 1, kMaxLast, stages_usage);
                if (!v) return inspect_error("stages: " + parse.error);
                last = static_cast<int>(*v);
              } else if (call.args[i] == "--since") {  // what rank 0 asks the others: the steps after
                auto v = parse.number(call.args, i, 0, std::numeric_limits<int64_t>::max() / 2, stages_usage);
                if (!v) return inspect_error("stages: " + parse.error);
                since = *v;
              } else if (call.args[i] == "--spans") {
                auto v = parse.number(call.args, i, 0, kMaxLast, stages_usage);
                if (!v) return inspect_error("stages: " + parse.error);
                spans = static_cast<int>(*v);
              } else {
                return inspect_error("stages: unknown argument \"" + call.args[i].substr(0, 32) + "\" -- " + stages_usage);
              }
            }
            if (call.local) return rank_steps_json(local_steps(*src, SpanRing::kDefaultSteps, since));
            // This process's last steps first, then the others' since the oldest of them: they answer
            // later (one after the other), and still hold those iterations in their rings.
            std::vector<RankSteps> all = local_steps(*src, kMaxLast, since);
            int64_t newest = -1;
            for (const RankSteps& r : all)
              if (!r.steps.empty()) newest = newest < 0 ? r.steps.back().iteration : std::min(newest, r.steps.back().iteration);
            const int64_t after = newest < 0 ? since : std::max(since, newest - kMaxLast);
            std::vector<std::string> unreachable;
            const std::string ask = after < 0 ? "stages" : "stages --since " + std::to_string(after);
            for (const std::string& answer : h->ask_peers(ask, unreachable)) {
              auto theirs = rank_steps_from_json(answer);
              if (!theirs) {
                unreachable.push_back("a peer's stages: " + theirs.status().message());
                continue;
              }
              for (RankSteps& r : theirs.value()) all.push_back(std::move(r));
            }
            const StagesReport report = stage_figures(all, src->schedule, src->given_as_data, last);
            return with_unreachable(stages_json(report, src->schedule, src->given_as_data, all, spans), unreachable);
          });
  hub.add("plan", "plan [RANK]",
          "the schedule table each stage executes (or RANK's stage), with where the ranks are in it now",
          [src, h](const InspectCall& call) {
            if (call.args.size() > 1) return inspect_error("plan: one RANK at most -- usage: plan [RANK]");
            std::vector<std::string> unreachable;
            const std::vector<Activity> all = call.local ? h->local_activities() : h->job_activities(unreachable);
            int only = -1;
            if (!call.args.empty()) {
              int highest = 0;
              for (const Activity& a : all) highest = std::max(highest, a.rank);
              auto r = parse_count(call.args[0], 0, std::numeric_limits<int>::max());
              const bool known = r && std::any_of(all.begin(), all.end(), [&](const Activity& a) { return a.rank == *r; });
              if (!known)
                return inspect_error("plan: RANK \"" + call.args[0].substr(0, 32) + "\" is not a rank of the job (0 to " +
                                     std::to_string(highest) + ") -- usage: plan [RANK]");
              only = static_cast<int>(*r);
            }
            return with_unreachable(plan_json(src->schedule, src->given_as_data, all, only), unreachable);
          });
  const std::string history_usage = "usage: history [--last N] [--since ITERATION]";
  hub.add("history", "history [--last N] [--since ITERATION]",
          "the job's iterations: loss, learning rate, gradient norm and ms per iteration (the last 10000 kept)",
          [src, history_usage](const InspectCall& call) {
            const size_t capacity = src->history ? src->history->capacity() : 0;
            int64_t since = -1;
            size_t last = capacity;
            Args parse;
            for (size_t i = 0; i < call.args.size(); ++i) {
              if (call.args[i] == "--last") {
                auto v = parse.number(call.args, i, 1, static_cast<int64_t>(std::max<size_t>(capacity, 1)), history_usage);
                if (!v) return inspect_error("history: " + parse.error);
                last = static_cast<size_t>(*v);
              } else if (call.args[i] == "--since") {
                auto v = parse.number(call.args, i, 0, std::numeric_limits<int64_t>::max() / 2, history_usage);
                if (!v) return inspect_error("history: " + parse.error);
                since = *v;
              } else {
                return inspect_error("history: unknown argument \"" + call.args[i].substr(0, 32) + "\" -- " + history_usage);
              }
            }
            if (!src->history) return history_json({}, 0);
            return history_json(src->history->points(since, last), capacity);
          });
  hub.add("moe", "moe",
          "each MoE layer's load in the last iteration: tokens routed to and kept by each expert, dropped, and "
          "the load-balancing and z losses",
          [src](const InspectCall& call) {
            if (!call.args.empty()) return inspect_error("moe: takes no arguments -- usage: moe");
            return moe_json(src->history ? src->history->last_moe() : MoeSnapshot{});
          });
  hub.add("stragglers", "stragglers",
          "every rank's straggler scores in the last iteration: against its stage's fastest rank and its own "
          "history, and the section where its time goes",
          [src](const InspectCall& call) {
            if (!call.args.empty()) return inspect_error("stragglers: takes no arguments -- usage: stragglers");
            return stragglers_json(src->history ? src->history->last_stragglers() : StragglerSnapshot{});
          });
}

}  // namespace troupe
