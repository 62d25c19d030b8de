// troupe: one binary, Megatron/DeepSpeed-style subcommands.
#include <cstdio>
#include <string>
#include <vector>
#include <exception>
#include <new>

#include "apps/commands.hpp"

int main(int argc, char** argv) {
  CLI::App app{"troupe: trains GPT models with tensor, pipeline and ZeRO data parallelism on actors"};
  app.require_subcommand(1, 1);
  app.failure_message([](const CLI::App* a, const CLI::Error& e) {
    // Name the subcommand being parsed ("troupe train") so the hint points at the right help.
    std::string command = "troupe";
    for (const CLI::App* sub = a; sub != nullptr;) {
      const auto parsed = sub->get_subcommands();
      if (parsed.empty()) break;
      sub = parsed.front();
      command += " " + sub->get_name();
    }
    return "troupe: error: " + std::string(e.what()) + "\n  run '" + command + " --help' for the accepted flags\n";
  });
  int exit_code = troupe::apps::kExitOk;
  troupe::apps::add_preprocess_command(app, &exit_code);
  troupe::apps::add_train_command(app, &exit_code);
  troupe::apps::add_eval_command(app, &exit_code);
  troupe::apps::add_generate_command(app, &exit_code);
  troupe::apps::add_serve_command(app, &exit_code);
  troupe::apps::add_ckpt_command(app, &exit_code);
  troupe::apps::add_bench_command(app, &exit_code);
  troupe::apps::add_info_command(app, &exit_code);
  troupe::apps::add_plot_command(app, &exit_code);
  troupe::apps::add_launch_command(app, &exit_code);
  troupe::apps::add_inspect_command(app, &exit_code);
  troupe::apps::add_plan_command(app, &exit_code);
  // troupe train: Megatron's and DeepSpeed's flags screened before CLI11 sees them.
  std::vector<std::string> args(argv + 1, argv + argc);
  // troupe launch: torchrun's grammar, where the command's first word ends the flags.
  if (!args.empty() && args[0] == "launch") {
    std::set<std::string> subcommands;
    for (const CLI::App* sub : app.get_subcommands({})) subcommands.insert(sub->get_name());
    return troupe::apps::run_launch_command({args.begin() + 1, args.end()}, subcommands);
  }
  if (!args.empty() && args[0] == "train") {
    std::vector<std::string> flags(args.begin() + 1, args.end());
    if (!troupe::apps::screen_train_command(flags)) return troupe::apps::kExitUsage;
    args.resize(1);
    args.insert(args.end(), flags.begin(), flags.end());
  }
  if (!args.empty() && args[0] == "plan") {
    std::vector<std::string> flags(args.begin() + 1, args.end());
    std::vector<std::string> own = troupe::apps::split_plan_args(flags);
    if (!troupe::apps::screen_train_command(flags, /*for_plan=*/true)) return troupe::apps::kExitUsage;
    args.resize(1);
    args.insert(args.end(), own.begin(), own.end());
    args.insert(args.end(), flags.begin(), flags.end());
  }
  try {
    std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes a vector last first
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : troupe::apps::kExitUsage;
  } catch (const std::bad_alloc&) {
    // Validation refuses configurations that cannot fit (exit 2); this is memory running out anyway.
    std::fprintf(stderr, "troupe: error: out of memory -- lower --micro-batch-size, the model size or the ranks per "
                         "host, or free memory on this machine\n");
    return troupe::apps::kExitFailure;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "troupe: error: %s\n", e.what());
    return troupe::apps::kExitFailure;
  }
  return exit_code;
}
