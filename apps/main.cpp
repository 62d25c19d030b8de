// troupe: one binary, Megatron/DeepSpeed-style subcommands.
#include <cstdio>
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
  troupe::apps::add_ckpt_command(app, &exit_code);
  troupe::apps::add_bench_command(app, &exit_code);
  troupe::apps::add_info_command(app, &exit_code);
  troupe::apps::add_plot_command(app, &exit_code);
  troupe::apps::add_launch_command(app, &exit_code);
  troupe::apps::add_inspect_command(app, &exit_code);
  try {
    app.parse(argc, argv);
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
