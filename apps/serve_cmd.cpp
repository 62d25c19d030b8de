// troupe serve: Megatron's text-generation server API and OpenAI-style completions over a checkpoint
// (docs/SERVE.md; serve/server.hpp).
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <memory>
#include <thread>

#include <fmt/format.h>

#include "apps/commands.hpp"
#include "apps/generation_model.hpp"
#include "apps/report.hpp"
#include "serve/server.hpp"

namespace troupe::apps {

namespace {

std::atomic<int> g_serve_signal{0};
void on_serve_signal(int sig) { g_serve_signal = sig; }

struct ServeArgs {
  std::string load;
  int64_t iteration = -1;
  std::string bind = "127.0.0.1";
  int port = 8000;
  std::string token_file;
  int num_threads = 0;
  int http_threads = 16;
  DecodeLayout layout;
};

bool loopback(const std::string& host) { return host == "127.0.0.1" || host == "localhost" || host == "::1"; }

int run_serve(const ServeArgs& a) {
  const std::string name = "serve";
  ServeOptions o;
  o.host = a.bind;
  o.port = a.port;
  o.http_threads = a.http_threads;
  o.threads = a.num_threads > 0 ? a.num_threads : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  if (!a.token_file.empty()) {
    std::ifstream in(a.token_file);
    std::string token;
    if (!in || !std::getline(in, token) || token.size() < 16 || token.size() > 4096) {
      print_error(name, "--token-file " + a.token_file + " does not hold a token of 16 to 4096 characters on its first "
                        "line -- write one, e.g. troupe launch --new-token > FILE");
      return kExitUsage;
    }
    o.token = token;
  } else if (const char* env = std::getenv("TROUPE_SERVE_TOKEN"); env != nullptr && *env != '\0') {
    o.token = env;
  }
  if (!loopback(a.bind) && o.token.empty()) {
    print_error(name, "--bind " + a.bind + " listens beyond this host, so requests need a bearer token -- give "
                      "--token-file FILE (or TROUPE_SERVE_TOKEN), or bind to 127.0.0.1");
    return kExitUsage;
  }
  if (a.port < 0 || a.port > 65535) {
    print_error(name, fmt::format("--port {} is not a port -- give 0 to 65535 (0: a free one)", a.port));
    return kExitUsage;
  }
  DecodeLayout layout = a.layout;
  layout.num_threads = o.threads;
  // Under troupe launch: one process per decode rank; rank 0 serves, the others follow it.
  auto procs = join_decode_processes(layout, a.num_threads);
  if (!procs) {
    print_error(name, procs.status());
    return exit_code_for(procs.status());
  }
  if (procs.value().follower()) return follow_decode(name, a.load, a.iteration, layout, procs.value());
  auto loaded = load_generation_model(a.load, a.iteration, layout);
  if (!loaded) {
    print_error(name, loaded.status());
    return exit_code_for(loaded.status());
  }
  o.model_name = fmt::format("{}@{}", a.load, loaded.value().iteration);
  auto server = InferenceServer::start(std::move(loaded.value().decoder), std::move(loaded.value().tokenizer), o);
  if (!server) {
    print_error(name, server.status().with_context("--bind " + a.bind + " --port " + std::to_string(a.port) + ": "));
    return exit_code_for(server.status());
  }
  std::printf("troupe serve: %s on http://%s:%d (PUT /api, POST /v1/completions, GET /metrics)%s\n", o.model_name.c_str(),
              a.bind.c_str(), server.value()->port(), o.token.empty() ? "" : "; bearer token required");
  std::fflush(stdout);
  std::signal(SIGINT, on_serve_signal);
  std::signal(SIGTERM, on_serve_signal);
  while (g_serve_signal == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  server.value()->stop();
  std::printf("troupe serve: stopped\n");
  return kExitOk;
}

}  // namespace

void add_serve_command(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<ServeArgs>();
  CLI::App* cmd = app.add_subcommand("serve", "Serve a checkpoint: Megatron's PUT /api and OpenAI-style /v1/completions "
                                              "(docs/SERVE.md)");
  cmd->add_option("--load", a->load, "checkpoint directory (as written by --save)")->required();
  cmd->add_option("--iteration", a->iteration, "the checkpoint's iteration (default: the latest)");
  cmd->add_option("--bind", a->bind, "address to listen on (beyond loopback a token is required)")->capture_default_str();
  cmd->add_option("--port", a->port, "port (0: a free one, printed)")->capture_default_str();
  cmd->add_option("--token-file", a->token_file, "a file whose first line is the bearer token requests must carry "
                                                  "(or TROUPE_SERVE_TOKEN)");
  cmd->add_option("--num-threads", a->num_threads, "compute threads (0: all cores)")->capture_default_str();
  cmd->add_option("--http-threads", a->http_threads, "connections served at once")->capture_default_str();
  add_decode_layout_options(cmd, a->layout);
  cmd->callback([a, exit_code] { *exit_code = run_serve(*a); });
}

}  // namespace troupe::apps
