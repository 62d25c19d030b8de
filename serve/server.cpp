// serve/server.hpp.
#include "serve/server.hpp"

#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include <fmt/format.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "kernels/thread_pool.hpp"
#include "model/generation.hpp"
#include "serve/page.hpp"
#include "serve/request.hpp"

namespace troupe {

namespace {

using Clock = std::chrono::steady_clock;

// One prompt's generation as the connection that asked for it sees it.
struct Job {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int32_t> tokens;
  std::vector<double> log_probs;
  bool done = false;
  std::string error;  // set instead of `result` when the generation failed
  Generation result;
  Clock::time_point start = Clock::now();
};

// A Prometheus histogram of seconds.
class Histogram {
 public:
  void observe(double s) {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < kBounds.size(); ++i)
      if (s <= kBounds[i]) ++counts_[i];
    ++count_;
    sum_ += s;
  }
  std::string text(const std::string& name, const std::string& help) const {
    std::lock_guard<std::mutex> lock(mu_);
    std::string out = fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
    for (size_t i = 0; i < kBounds.size(); ++i)
      out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, kBounds[i], counts_[i]);
    out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, count_, name, sum_, name, count_);
    return out;
  }

 private:
  static constexpr std::array<double, 10> kBounds{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
  mutable std::mutex mu_;
  std::array<uint64_t, 10> counts_{};
  uint64_t count_ = 0;
  double sum_ = 0;
};

// The text a stream may send of `text` so far: not a partial UTF-8 character at its end, and not the
// last `hold` bytes (they could begin a stop string).
size_t sendable(const std::string& text, size_t hold) {
  size_t n = text.size() > hold ? text.size() - hold : 0;
  // Back off a trailing incomplete UTF-8 sequence.
  size_t i = n;
  int back = 0;
  while (i > 0 && back < 4 && (static_cast<unsigned char>(text[i - 1]) & 0xC0) == 0x80) {
    --i;
    ++back;
  }
  if (i > 0) {
    const unsigned char lead = static_cast<unsigned char>(text[i - 1]);
    const int need = lead >= 0xF0 ? 3 : lead >= 0xE0 ? 2 : lead >= 0xC0 ? 1 : 0;
    if (need > back) n = i - 1;
  }
  return n;
}

}  // namespace

struct InferenceServer::Impl {
  std::unique_ptr<SequenceDecoder> decoder;
  std::unique_ptr<Tokenizer> tokenizer;
  ServeOptions options;
  httplib::Server http;
  int port = 0;
  std::thread listener, generator;

  std::mutex mu;
  std::condition_variable cv;
  std::vector<BatchGenerator::Request> pending;
  std::vector<std::function<void(Context&)>> tasks;  // run on the generation thread between steps
  bool stopping = false;
  std::atomic<size_t> running{0};
  std::atomic<uint64_t> seed_counter{0};
  uint64_t seed_base = 0;

  // Metrics.
  std::mutex metrics_mu;
  std::map<std::pair<std::string, int>, uint64_t> requests;  // (api, HTTP status) -> count
  std::atomic<uint64_t> prompts{0}, generated{0};
  std::atomic<double> busy_seconds{0};
  Histogram latency, first_token;

  void count(const std::string& api, int status) {
    std::lock_guard<std::mutex> lock(metrics_mu);
    ++requests[{api, status}];
  }

  // The generation thread: admits what is pending, steps, until stopped.
  void generate_loop() {
    ThreadPool pool(std::max(1, options.threads));
    Context ctx;
    ctx.pool = &pool;
    BatchGenerator batch(*decoder);
    std::vector<std::function<void(Context&)>> run;
    for (;;) {
      std::vector<BatchGenerator::Request> admit;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] {
          return stopping || !pending.empty() || !tasks.empty() || batch.running() > 0 || batch.queued() > 0;
        });
        if (stopping) break;
        admit.swap(pending);
        run.swap(tasks);
      }
      for (auto& task : run) task(ctx);
      run.clear();
      for (BatchGenerator::Request& r : admit) {
        auto on_done = r.on_done;
        if (Status st = batch.add(std::move(r)); !st && on_done) {
          Generation failed;
          failed.finish_reason = "error: " + st.message();
          on_done(std::move(failed));
        }
      }
      const auto t0 = Clock::now();
      auto stepped = batch.step(ctx);
      busy_seconds = busy_seconds + std::chrono::duration<double>(Clock::now() - t0).count();
      running = batch.running();
      if (!stepped) {
        std::fprintf(stderr, "troupe serve: generation failed: %s\n", stepped.status().message().c_str());
        break;
      }
    }
  }

  // Queues one prompt; the job fills as its tokens come.
  std::shared_ptr<Job> submit(std::vector<int32_t> prompt, const GenerationOptions& o, int64_t index) {
    auto job = std::make_shared<Job>();
    BatchGenerator::Request r;
    r.prompt = std::move(prompt);
    r.options = o;
    r.index = index;
    r.on_token = [this, job](int32_t token, double lp) {
      ++generated;
      std::lock_guard<std::mutex> lock(job->mu);
      if (job->tokens.empty()) first_token.observe(std::chrono::duration<double>(Clock::now() - job->start).count());
      job->tokens.push_back(token);
      job->log_probs.push_back(lp);
      job->cv.notify_all();
    };
    r.on_done = [job](Generation g) {
      std::lock_guard<std::mutex> lock(job->mu);
      if (g.finish_reason.rfind("error: ", 0) == 0) job->error = g.finish_reason.substr(7);
      job->result = std::move(g);
      job->done = true;
      job->cv.notify_all();
    };
    ++prompts;
    {
      std::lock_guard<std::mutex> lock(mu);
      pending.push_back(std::move(r));
    }
    cv.notify_all();
    return job;
  }

  // Waits for the job; false when the server stops first.
  bool wait(Job& job) {
    std::unique_lock<std::mutex> lock(job.mu);
    while (!job.done) {
      if (job.cv.wait_for(lock, std::chrono::milliseconds(200)) == std::cv_status::timeout) {
        std::lock_guard<std::mutex> g(mu);
        if (stopping) return false;
      }
    }
    return true;
  }

  // The options of one request, its prompts tokenized; bad input (400) with the reason.
  Result<std::vector<std::vector<int32_t>>> prepare(const ServeRequest& q, GenerationOptions& o) {
    o.sampling = q.sampling;
    if (!q.seeded) o.sampling.seed = seed_base + seed_counter++;
    o.tokens_to_generate = q.tokens_to_generate;
    o.stop_tokens = {q.has_stop_token ? q.stop_token : tokenizer->eod()};
    const Tokenizer* tok = tokenizer.get();
    const std::vector<std::string> stops = q.stop;
    const bool eol = q.stop_on_eol, double_eol = q.stop_on_double_eol;
    if (!stops.empty() || eol || double_eol)
      o.stop = [tok, stops, eol, double_eol](size_t, const std::vector<int32_t>& generated) {
        const std::string text = tok->decode(generated);
        if (eol && text.find('\n') != std::string::npos) return true;
        if (double_eol && text.find("\n\n") != std::string::npos) return true;
        for (const std::string& s : stops)
          if (text.find(s) != std::string::npos) return true;
        return false;
      };
    std::vector<std::vector<int32_t>> ids;
    std::vector<std::string> problems = check_sampling(o.sampling);
    const GptConfig& m = decoder->config();
    for (size_t i = 0; i < q.prompts.size(); ++i) {
      std::vector<int32_t> p = tokenizer->encode(q.prompts[i]);
      if (q.add_bos) p.insert(p.begin(), tokenizer->eod());
      if (p.empty()) problems.push_back(fmt::format("prompt {} is empty -- give it some text", i + 1));
      const int64_t total = static_cast<int64_t>(p.size()) + q.tokens_to_generate;
      if (total > m.max_position_embeddings)
        problems.push_back(fmt::format("prompt {} is {} tokens, and with {} to generate {} is over the model's {} "
                                       "positions -- shorten it or generate fewer tokens",
                                       i + 1, p.size(), q.tokens_to_generate, total, m.max_position_embeddings));
      ids.push_back(std::move(p));
    }
    if (!problems.empty()) {
      std::string message = problems[0];
      for (size_t i = 1; i < problems.size(); ++i) message += "; " + problems[i];
      return Status::bad_input(message);
    }
    return ids;
  }

  // The generated text as the request returns it: cut before the first stop string.
  std::string final_text(const ServeRequest& q, const std::vector<int32_t>& tokens) const {
    std::string text = tokenizer->decode(tokens);
    for (const std::string& s : q.stop)
      if (size_t at = text.find(s); at != std::string::npos) text.resize(at);
    return text;
  }

  bool authorized(const httplib::Request& req) const {
    if (options.token.empty()) return true;
    const std::string auth = req.get_header_value("Authorization");
    return auth.size() == 7 + options.token.size() && auth.rfind("Bearer ", 0) == 0 && auth.compare(7, std::string::npos, options.token) == 0;
  }

  void reply(httplib::Response& res, const std::string& api, int status, const nlohmann::json& body) {
    count(api, status);
    res.status = status;
    res.set_content(body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), "application/json");
  }
  void refuse(httplib::Response& res, const std::string& api, int status, const std::string& message) {
    reply(res, api, status, api == "completions" ? nlohmann::json{{"error", {{"message", message}, {"type", "invalid_request_error"}}}}
                                                  : nlohmann::json(message));
  }

  void megatron(const httplib::Request& req, httplib::Response& res) {
    const std::string api = "megatron";
    if (!authorized(req)) return refuse(res, api, 401, "a bearer token is required: Authorization: Bearer TOKEN");
    auto q = parse_megatron_request(req.body);
    if (!q) return refuse(res, api, 400, q.status().message());
    GenerationOptions o;
    auto ids = prepare(q.value(), o);
    o.prompt_log_probs = q.value().logprobs;  // Megatron's answer carries them then
    if (!ids) return refuse(res, api, 400, ids.status().message());
    const auto t0 = Clock::now();
    if (q.value().beam_width > 0) return beam(q.value(), ids.value()[0], res, t0);
    std::vector<std::shared_ptr<Job>> jobs;
    for (size_t i = 0; i < ids.value().size(); ++i) jobs.push_back(submit(ids.value()[i], o, static_cast<int64_t>(i)));
    nlohmann::json text = nlohmann::json::array(), segments = nlohmann::json::array(), tokens = nlohmann::json::array(),
                   logprobs = nlohmann::json::array();
    for (size_t i = 0; i < jobs.size(); ++i) {
      if (!wait(*jobs[i])) return refuse(res, api, 503, "the server is stopping");
      if (!jobs[i]->error.empty()) return refuse(res, api, 500, jobs[i]->error);
      const Generation& g = jobs[i]->result;
      std::vector<int32_t> all = ids.value()[i];
      all.insert(all.end(), g.tokens.begin(), g.tokens.end());
      text.push_back(q.value().prompts[i] + final_text(q.value(), g.tokens));
      nlohmann::json seg = nlohmann::json::array();
      for (int32_t t : all) seg.push_back(tokenizer->decode({t}));
      segments.push_back(seg);
      tokens.push_back(all);
      std::vector<double> lp = g.prompt_log_probs;
      lp.insert(lp.end(), g.log_probs.begin(), g.log_probs.end());
      logprobs.push_back(lp);
    }
    latency.observe(std::chrono::duration<double>(Clock::now() - t0).count());
    nlohmann::json out = {{"text", text}, {"segments", segments}, {"tokens", tokens}};
    if (q.value().logprobs) out["logprobs"] = logprobs;
    reply(res, api, 200, out);
  }

  // Megatron's beam search answer: every hypothesis (best first) with its score.
  void beam(const ServeRequest& q, const std::vector<int32_t>& prompt, httplib::Response& res, Clock::time_point t0) {
    const std::string api = "megatron";
    auto job = std::make_shared<Job>();
    auto hyps = std::make_shared<Result<std::vector<BeamHypothesis>>>(std::vector<BeamHypothesis>{});
    const int32_t stop = q.has_stop_token ? q.stop_token : tokenizer->eod();
    {
      std::lock_guard<std::mutex> lock(mu);
      tasks.push_back([this, job, hyps, q, prompt, stop](Context& ctx) {
        *hyps = beam_search(ctx, *decoder, prompt, q.beam_width, q.tokens_to_generate, stop, q.length_penalty);
        std::lock_guard<std::mutex> g(job->mu);
        job->done = true;
        job->cv.notify_all();
      });
    }
    cv.notify_all();
    if (!wait(*job)) return refuse(res, api, 503, "the server is stopping");
    if (!hyps->is_ok()) return refuse(res, api, hyps->status().is_bad_input() ? 400 : 500, hyps->status().message());
    nlohmann::json text = nlohmann::json::array(), segments = nlohmann::json::array(), scores = nlohmann::json::array();
    for (const BeamHypothesis& h : hyps->value()) {
      std::vector<int32_t> all = prompt;
      all.insert(all.end(), h.tokens.begin(), h.tokens.end());
      text.push_back(q.prompts[0] + tokenizer->decode(h.tokens));
      nlohmann::json seg = nlohmann::json::array();
      for (int32_t t : all) seg.push_back(tokenizer->decode({t}));
      segments.push_back(seg);
      scores.push_back(h.score);
    }
    latency.observe(std::chrono::duration<double>(Clock::now() - t0).count());
    reply(res, api, 200, {{"text", text}, {"segments", segments}, {"scores", scores}});
  }

  nlohmann::json completion_logprobs(const std::vector<int32_t>& tokens, const std::vector<double>& lps) const {
    nlohmann::json strings = nlohmann::json::array(), values = nlohmann::json::array(), offsets = nlohmann::json::array();
    size_t offset = 0;
    for (size_t i = 0; i < tokens.size(); ++i) {
      const std::string s = tokenizer->decode({tokens[i]});
      strings.push_back(s);
      values.push_back(i < lps.size() ? nlohmann::json(lps[i]) : nlohmann::json(nullptr));
      offsets.push_back(offset);
      offset += s.size();
    }
    return {{"tokens", strings}, {"token_logprobs", values}, {"top_logprobs", nullptr}, {"text_offset", offsets}};
  }

  void completions(const httplib::Request& req, httplib::Response& res) {
    const std::string api = "completions";
    if (!authorized(req)) return refuse(res, api, 401, "a bearer token is required: Authorization: Bearer TOKEN");
    auto parsed = parse_completions_request(req.body);
    if (!parsed) return refuse(res, api, 400, parsed.status().message());
    const ServeRequest q = parsed.value();
    GenerationOptions o;
    auto ids = prepare(q, o);
    o.prompt_log_probs = false;  // the completions' logprobs are the generated tokens' own
    if (!ids) return refuse(res, api, 400, ids.status().message());
    const auto t0 = Clock::now();
    const std::string id = fmt::format("cmpl-{:x}{:x}", seed_base, seed_counter++);
    const int64_t created = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
    const std::string model = q.model.empty() ? options.model_name : q.model;
    std::vector<std::shared_ptr<Job>> jobs;
    for (size_t i = 0; i < ids.value().size(); ++i) jobs.push_back(submit(ids.value()[i], o, static_cast<int64_t>(i)));
    if (!q.stream) {
      nlohmann::json choices = nlohmann::json::array();
      int64_t prompt_tokens = 0, completion_tokens = 0;
      for (size_t i = 0; i < jobs.size(); ++i) {
        if (!wait(*jobs[i])) return refuse(res, api, 503, "the server is stopping");
        if (!jobs[i]->error.empty()) return refuse(res, api, 500, jobs[i]->error);
        const Generation& g = jobs[i]->result;
        prompt_tokens += static_cast<int64_t>(ids.value()[i].size());
        completion_tokens += static_cast<int64_t>(g.tokens.size());
        std::string text = final_text(q, g.tokens);
        nlohmann::json lp = nullptr;
        if (q.logprobs) lp = completion_logprobs(g.tokens, g.log_probs);
        choices.push_back({{"index", i},
                           {"text", q.echo ? q.prompts[i] + text : text},
                           {"logprobs", lp},
                           {"finish_reason", g.finish_reason == "length" ? "length" : "stop"}});
      }
      latency.observe(std::chrono::duration<double>(Clock::now() - t0).count());
      return reply(res, api, 200,
                   {{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model}, {"choices", choices},
                    {"usage", {{"prompt_tokens", prompt_tokens}, {"completion_tokens", completion_tokens},
                               {"total_tokens", prompt_tokens + completion_tokens}}}});
    }
    // Server-sent events: a chunk per piece of text as it is generated, each prompt's last with its
    // finish_reason, then [DONE].
    count(api, 200);
    size_t hold = 0;
    for (const std::string& s : q.stop) hold = std::max(hold, s.size() - 1);
    struct StreamState {
      size_t prompt = 0, sent = 0;
      size_t seen = 0;  // the prompt's tokens already looked at: wait for more than these
      int64_t completion_tokens = 0;
      bool echoed = false, finished = false;
    };
    auto state = std::make_shared<StreamState>();
    int64_t prompt_tokens = 0;
    for (const auto& p : ids.value()) prompt_tokens += static_cast<int64_t>(p.size());
    res.set_header("Cache-Control", "no-store");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, q, jobs, state, hold, id, created, model, t0, prompt_tokens](size_t, httplib::DataSink& sink) {
          auto event = [&](const nlohmann::json& j) {
            const std::string line = "data: " + j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n\n";
            return sink.write(line.data(), line.size());
          };
          auto chunk = [&](size_t index, const std::string& text, const nlohmann::json& finish) {
            return event({{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model},
                          {"choices", {{{"index", index}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", finish}}}}});
          };
          if (state->finished) return false;
          if (state->prompt >= jobs.size()) {
            if (q.include_usage &&  // OpenAI's stream_options.include_usage: no choices, the request's usage
                !event({{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model},
                        {"choices", nlohmann::json::array()},
                        {"usage", {{"prompt_tokens", prompt_tokens}, {"completion_tokens", state->completion_tokens},
                                   {"total_tokens", prompt_tokens + state->completion_tokens}}}}))
              return false;
            const std::string done = "data: [DONE]\n\n";
            sink.write(done.data(), done.size());
            latency.observe(std::chrono::duration<double>(Clock::now() - t0).count());
            state->finished = true;
            sink.done();
            return true;
          }
          Job& job = *jobs[state->prompt];
          if (!state->echoed) {
            state->echoed = true;
            if (q.echo && !chunk(state->prompt, q.prompts[state->prompt], nullptr)) return false;
          }
          std::vector<int32_t> tokens;
          bool done = false;
          std::string error;
          {
            std::unique_lock<std::mutex> lock(job.mu);
            job.cv.wait_for(lock, std::chrono::milliseconds(200),
                            [&] { return job.done || job.tokens.size() > state->seen; });
            tokens = job.tokens;
            state->seen = tokens.size();
            done = job.done;
            error = job.error;
            if (done) tokens = job.result.tokens;
          }
          {
            std::lock_guard<std::mutex> g(mu);
            if (stopping) return false;
          }
          if (!error.empty()) {
            event({{"error", {{"message", error}}}});
            return false;
          }
          const std::string text = done ? final_text(q, tokens) : tokenizer->decode(tokens);
          const size_t upto = done ? text.size() : std::min(text.size(), sendable(text, hold));
          if (upto > state->sent) {
            if (!chunk(state->prompt, text.substr(state->sent, upto - state->sent), nullptr)) return false;
            state->sent = upto;
          }
          if (done) {
            std::string reason;
            {
              std::lock_guard<std::mutex> lock(job.mu);
              reason = job.result.finish_reason == "length" ? "length" : "stop";
            }
            if (!chunk(state->prompt, "", reason)) return false;
            state->completion_tokens += static_cast<int64_t>(tokens.size());
            ++state->prompt;
            state->sent = 0;
            state->seen = 0;
            state->echoed = false;
          }
          return true;
        });
  }

  std::string metrics() {
    std::string out = "# HELP troupe_serve_requests_total Requests answered, by API and HTTP status.\n"
                      "# TYPE troupe_serve_requests_total counter\n";
    {
      std::lock_guard<std::mutex> lock(metrics_mu);
      for (const auto& [key, n] : requests)
        out += fmt::format("troupe_serve_requests_total{{api=\"{}\",code=\"{}\"}} {}\n", key.first, key.second, n);
    }
    size_t queued = 0;
    {
      std::lock_guard<std::mutex> lock(mu);
      queued = pending.size();
    }
    const double busy = busy_seconds;
    out += fmt::format(
        "# HELP troupe_serve_prompts_total Prompts accepted.\n# TYPE troupe_serve_prompts_total counter\n"
        "troupe_serve_prompts_total {}\n"
        "# HELP troupe_serve_generated_tokens_total Tokens generated.\n# TYPE troupe_serve_generated_tokens_total counter\n"
        "troupe_serve_generated_tokens_total {}\n"
        "# HELP troupe_serve_queue Prompts waiting to join the batch.\n# TYPE troupe_serve_queue gauge\n"
        "troupe_serve_queue {}\n"
        "# HELP troupe_serve_running Sequences in the batch.\n# TYPE troupe_serve_running gauge\n"
        "troupe_serve_running {}\n"
        "# HELP troupe_serve_tokens_per_second Tokens generated per second the generation thread computed.\n"
        "# TYPE troupe_serve_tokens_per_second gauge\ntroupe_serve_tokens_per_second {}\n",
        prompts.load(), generated.load(), queued, running.load(), busy > 0 ? static_cast<double>(generated.load()) / busy : 0.0);
    out += latency.text("troupe_serve_request_seconds", "Seconds from a request's arrival to its last token.");
    out += first_token.text("troupe_serve_time_to_first_token_seconds", "Seconds from a prompt's arrival to its first token.");
    return out;
  }
};

InferenceServer::InferenceServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<InferenceServer>> InferenceServer::start(std::unique_ptr<SequenceDecoder> decoder,
                                                                std::unique_ptr<Tokenizer> tokenizer,
                                                                const ServeOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->decoder = std::move(decoder);
  impl->tokenizer = std::move(tokenizer);
  impl->options = options;
  impl->seed_base = std::random_device{}();
  Impl* self = impl.get();
  httplib::Server& s = impl->http;
  const int workers = std::max(2, options.http_threads);
  s.new_task_queue = [workers] { return new httplib::ThreadPool(static_cast<size_t>(workers)); };
  s.set_socket_options([](socket_t sock) {
    int yes = 1;
    (void)::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  s.set_payload_max_length(1 << 20);
  s.set_read_timeout(30, 0);
  s.set_write_timeout(30, 0);
  s.Put("/api", [self](const httplib::Request& req, httplib::Response& res) { self->megatron(req, res); });
  s.Post("/v1/completions", [self](const httplib::Request& req, httplib::Response& res) { self->completions(req, res); });
  s.Post("/completions", [self](const httplib::Request& req, httplib::Response& res) { self->completions(req, res); });
  s.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_header("Cache-Control", "no-store");
    res.set_header("X-Content-Type-Options", "nosniff");
    res.set_header("Content-Security-Policy",
                   "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; "
                   "frame-ancestors 'none'");
    res.set_content(serve_page(), "text/html; charset=utf-8");
  });
  s.Get("/metrics", [self](const httplib::Request& req, httplib::Response& res) {
    if (!self->authorized(req)) return self->refuse(res, "metrics", 401, "a bearer token is required");
    res.set_content(self->metrics(), "text/plain; version=0.0.4");
  });
  const int port = options.port == 0 ? s.bind_to_any_port(options.host)
                                     : (s.bind_to_port(options.host, options.port) ? options.port : -1);
  if (port <= 0)
    return Status::bad_input(fmt::format("cannot listen on {}:{} (in use, or not an address of this host) -- give "
                                         "another --port, or 0 for a free one",
                                         options.host, options.port));
  impl->port = port;
  impl->generator = std::thread([self] { self->generate_loop(); });
  impl->listener = std::thread([self] { self->http.listen_after_bind(); });
  return std::unique_ptr<InferenceServer>(new InferenceServer(std::move(impl)));
}

InferenceServer::~InferenceServer() { stop(); }

int InferenceServer::port() const { return impl_->port; }

void InferenceServer::stop() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  impl_->http.stop();
  if (impl_->listener.joinable()) impl_->listener.join();
  if (impl_->generator.joinable()) impl_->generator.join();
}

void InferenceServer::wait() {
  if (impl_->listener.joinable()) impl_->listener.join();
}

}  // namespace troupe
