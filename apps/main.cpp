// troupe: one binary, Megatron/DeepSpeed-style subcommands.
#include <cstdio>

#include "apps/commands.hpp"

int main(int argc, char** argv) {
  CLI::App app{"troupe: trains GPT models with tensor, pipeline and ZeRO data parallelism on actors"};
  app.require_subcommand(1, 1);
  app.failure_message([](const CLI::App* a, const CLI::Error& e) {
    std::string msg = std::string("troupe: error: ") + e.what() + "\n";
    msg += "  run '" + a->get_name() + " --help' for the accepted flags\n";
    return msg;
  });
  int exit_code = troupe::apps::kExitOk;
  troupe::apps::add_preprocess_command(app, &exit_code);
  troupe::apps::add_train_command(app, &exit_code);
  troupe::apps::add_eval_command(app, &exit_code);
  troupe::apps::add_ckpt_command(app, &exit_code);
  troupe::apps::add_bench_command(app, &exit_code);
  troupe::apps::add_info_command(app, &exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : troupe::apps::kExitUsage;
  }
  return exit_code;
}
