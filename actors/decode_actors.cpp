// actors/decode_actors.hpp.
#include "actors/decode_actors.hpp"

#include <algorithm>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include <caf/all.hpp>

#include "actors/errors.hpp"
#include "actors/messages.hpp"
#include "comm/local/local_world.hpp"
#include "kernels/thread_pool.hpp"
#include "model/decode_work.hpp"
#include "model/decoder_shard.hpp"

namespace troupe {

void configure_blas_threads();

namespace {

using DecodeWorkPtr = std::shared_ptr<const DecodeWork>;

struct DecodeReply {
  std::vector<std::vector<float>> logits;  // the last stage's tensor-parallel rank 0; empty elsewhere
};

}  // namespace

}  // namespace troupe

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::DecodeWorkPtr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::DecodeReply)

namespace troupe {

namespace {

using decode_atom = caf::atom_constant<caf::atom("decode")>;
using decode_rank_actor = caf::typed_actor<caf::replies_to<init_atom>::with<ok_atom>,
                                           caf::replies_to<decode_atom, DecodeWorkPtr>::with<DecodeReply>>;

struct DecodeRankState {
  int rank = 0;
  std::shared_ptr<comm::CommWorld> world;
  std::unique_ptr<comm::Communicator> tp, pp;
  std::unique_ptr<ThreadPool> pool;
  Context ctx;
  std::unique_ptr<DecoderShard> shard;
  Status created;
};

// How a rank reaches the others: its world (a local fabric's, or the job's UCX world when the ranks
// are processes), and what failing does to them (a local fabric is aborted, so no rank waits on this
// one; a process's peers see it exit).
struct RankLink {
  std::shared_ptr<comm::CommWorld> world;
  std::function<void(const std::string& why)> abort;
};

decode_rank_actor::behavior_type decode_rank(decode_rank_actor::stateful_pointer<DecodeRankState> self,
                                             RankLink link, GptConfig config, ParallelDecodeOptions o,
                                             int rank, int threads, const Decoder* whole) {
  configure_blas_threads();
  name_exceptions(self, "decode rank " + std::to_string(rank));
  auto& st = self->state;
  st.rank = rank;
  const int stage = rank / o.tp, tp_rank = rank % o.tp;
  st.world = link.world;
  std::vector<int> tp_members, pp_members;
  for (int r = 0; r < o.tp; ++r) tp_members.push_back(stage * o.tp + r);
  for (int s = 0; s < o.pp; ++s) pp_members.push_back(s * o.tp + tp_rank);
  auto tp = st.world->group(tp_members);
  auto pp = tp ? st.world->group(pp_members) : Result<std::unique_ptr<comm::Communicator>>(tp.status());
  if (!tp || !pp) {
    st.created = (!tp ? tp.status() : pp.status()).with_context("decode rank " + std::to_string(rank) + ": ");
  } else {
    st.tp = std::move(tp).value();
    st.pp = std::move(pp).value();
    st.pool = std::make_unique<ThreadPool>(threads);
    st.ctx.pool = st.pool.get();
    DecoderShardSpec spec = DecoderShardSpec::of(config, o.tp, tp_rank, o.pp, stage);
    spec.dtype = o.dtype;
    spec.expert_parallel = o.expert_parallel;
    st.shard = std::make_unique<DecoderShard>(config, spec, st.tp.get());
    // The whole model's tensors, read while create() waits for every rank's init.
    st.shard->load_from_whole([whole](const std::string& name) { return whole->param(name); });
  }
  auto fail = [self, abort = link.abort](const std::string& why) {
    const std::string what = "decode rank " + std::to_string(self->state.rank) + ": " + why;
    if (abort) abort(what);
    return make_actor_error(ActorErrc::failed, what);
  };
  return {
      [self](init_atom) -> caf::result<ok_atom> {
        if (!self->state.created) return to_caf_error(self->state.created);
        return ok_atom::value;
      },
      [self, fail, o, stage](decode_atom, const DecodeWorkPtr& w) -> caf::result<DecodeReply> {
        auto& st = self->state;
        if (!st.created) return to_caf_error(st.created);
        DecodeReply reply;
        try {
          DecoderShard& shard = *st.shard;
          for (const SlotOp& op : w->ops) {
            if (op.kind == SlotOp::open) shard.open(op.id);
            else if (op.kind == SlotOp::close) shard.close(op.id);
            else shard.copy(op.from, op.id);
          }
          if (w->rows.ids.empty()) return reply;
          const int64_t C = shard.config().hidden_size;
          std::vector<std::pair<comm::WorkPtr, Tensor>> sends;  // in flight to the next stage
          const bool collects = shard.spec().head && st.tp->rank() == 0;
          size_t begin = 0;
          for (size_t k = 0; k < w->group_end.size(); ++k) {
            const size_t end = w->group_end[k];
            const DecodeRows part = w->rows.part(begin, end);
            Tensor x;
            if (shard.spec().embedding) {
              const std::vector<std::vector<int32_t>> tokens(w->tokens.begin() + static_cast<std::ptrdiff_t>(begin),
                                                             w->tokens.begin() + static_cast<std::ptrdiff_t>(end));
              x = shard.embed(st.ctx, part, tokens);
            } else {
              x = Tensor::empty({part.rows(), C}, shard.spec().dtype);
              comm::wait_or_throw(st.pp->recv(x.raw(), static_cast<size_t>(x.numel()), x.dtype(), stage - 1, k),
                                  "decode: a micro-batch from the previous stage");
            }
            shard.layers(st.ctx, part, x);
            if (shard.spec().head) {
              const std::vector<uint8_t> every(w->every.begin() + static_cast<std::ptrdiff_t>(begin),
                                               w->every.begin() + static_cast<std::ptrdiff_t>(end));
              auto logits = shard.head(st.ctx, part, x, every);
              if (collects)
                for (auto& l : logits) reply.logits.push_back(std::move(l));
            } else {
              sends.emplace_back(st.pp->send(x.raw(), static_cast<size_t>(x.numel()), x.dtype(), stage + 1, k), x);
            }
            begin = end;
          }
          for (auto& s : sends) comm::wait_or_throw(s.first, "decode: a micro-batch to the next stage");
          shard.advance(w->rows);
        } catch (const std::exception& e) {
          return fail(e.what());
        }
        return reply;
      },
  };
}

caf::actor_system_config decode_system_config() {
  caf::actor_system_config cfg;
  cfg.set("scheduler.max-threads", 2);  // routes messages only: the ranks are detached
  cfg.set("scheduler.policy", caf::atom("sharing"));
  return cfg;
}


// The options with their defaults filled in: micro-batches (0: pp) and compute threads (0: every core;
// the ranks of one process share them).
ParallelDecodeOptions resolved(const ParallelDecodeOptions& options) {
  ParallelDecodeOptions o = options;
  if (o.micro_batches <= 0) o.micro_batches = o.pp;
  if (o.num_threads <= 0) o.num_threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  return o;
}

// The collector (the last stage's tensor-parallel rank 0) and a work's wire header.
int collector_rank(const ParallelDecodeOptions& o) { return (o.pp - 1) * o.tp; }
constexpr int64_t kStopFeeds = -1;  // the header that ends a follower's loop
constexpr uint64_t kLogitsTag = 1;  // the collector's logits to rank 0

// Spawns this process's ranks [first, first + count) and waits for each one's init.
Status spawn_ranks(caf::actor_system& system, std::vector<decode_rank_actor>& out, const std::vector<RankLink>& links,
                   const GptConfig& config, const ParallelDecodeOptions& o, int first, int threads, const Decoder& whole) {
  for (size_t i = 0; i < links.size(); ++i)
    out.push_back(system.spawn<caf::detached>(decode_rank, links[i], config, o, first + static_cast<int>(i), threads, &whole));
  Status status;
  caf::scoped_actor self{system};
  for (const auto& r : out)
    self->request(r, caf::infinite, init_atom::value)
        .receive([](ok_atom) {},
                 [&](caf::error& err) {
                   if (status) status = to_status(err);
                 });
  return status;
}

// Sends `work` to this process's ranks and waits for all; the logits of the one at `collector`
// (an index into ranks), if any.
Result<std::vector<std::vector<float>>> run_local(caf::actor_system& system, const std::vector<decode_rank_actor>& ranks,
                                                  const DecodeWorkPtr& work, std::optional<size_t> collector) {
  caf::scoped_actor self{system};
  Status status;
  std::vector<std::vector<float>> logits;
  std::vector<decltype(self->request(ranks[0], caf::infinite, decode_atom::value, work))> handles;
  for (const auto& r : ranks) handles.push_back(self->request(r, caf::infinite, decode_atom::value, work));
  for (size_t i = 0; i < handles.size(); ++i)
    handles[i].receive(
        [&](DecodeReply& reply) {
          if (collector && i == *collector) logits = std::move(reply.logits);
        },
        [&](caf::error& err) {
          if (status) status = to_status(err);
        });
  if (!status) return status;
  return logits;
}

// A receive left in flight by a failed feed, with its buffer: never freed (the process is ending).
void keep_until_exit(std::shared_ptr<std::vector<float>> buffer, comm::WorkPtr work) {
  static std::mutex mutex;
  static auto* kept = new std::vector<std::pair<std::shared_ptr<std::vector<float>>, comm::WorkPtr>>();
  std::lock_guard<std::mutex> lock(mutex);
  kept->emplace_back(std::move(buffer), std::move(work));
}

// The rows a sequence's logits cover in the collector's flat buffer, split back per sequence.
std::vector<std::vector<float>> split_logits(const DecodeWork& w, const std::vector<float>& flat, int64_t vocab) {
  std::vector<std::vector<float>> out;
  size_t at = 0;
  for (size_t i = 0; i < w.tokens.size(); ++i) {
    const size_t n = (w.every[i] ? w.tokens[i].size() : 1) * static_cast<size_t>(vocab);
    out.emplace_back(flat.begin() + static_cast<std::ptrdiff_t>(at), flat.begin() + static_cast<std::ptrdiff_t>(at + n));
    at += n;
  }
  return out;
}

}  // namespace

struct ParallelDecoder::Impl {
  ParallelDecodeOptions options;
  caf::actor_system_config config = decode_system_config();
  caf::actor_system system{config};
  std::vector<decode_rank_actor> ranks;  // this process's: all t x p, or (processes) rank 0 alone
  std::vector<SlotOp> pending;  // sequence changes not yet sent
  Status failed;                // a feed failed: the fabric is gone
  // Ranks in processes of their own: the world, and the group of every process over which rank 0
  // (this one) broadcasts each feed and the collector returns its logits.
  std::shared_ptr<comm::CommWorld> world;
  std::unique_ptr<comm::Communicator> control;

  ~Impl() {
    if (control && failed) {  // the followers' loops end; a failed job's processes end with it
      int64_t stop = kStopFeeds;
      (void)control->broadcast(&stop, 1, DType::i64, 0)->wait();
    }
    caf::scoped_actor self{system};
    for (const auto& r : ranks) self->send_exit(r, caf::exit_reason::user_shutdown);
  }

  // Sends `work` to every rank and waits for all; the last stage's tp rank 0's logits.
  Result<std::vector<std::vector<float>>> run(const DecodeWorkPtr& work, int64_t vocab) {
    const int collector = collector_rank(options);
    if (!control)
      return run_local(system, ranks, work, static_cast<size_t>(collector));
    // Every process gets the feed's bytes (its size first), then each runs its rank.
    const std::string bytes = encode_decode_work(*work);
    int64_t size = static_cast<int64_t>(bytes.size());
    if (Status st = control->broadcast(&size, 1, DType::i64, 0)->wait(); !st) return st;
    if (Status st = control->broadcast(const_cast<char*>(bytes.data()), bytes.size(), DType::u8, 0)->wait(); !st) return st;
    if (collector == 0) return run_local(system, ranks, work, size_t{0});
    auto flat = std::make_shared<std::vector<float>>(decode_logits_count(*work, vocab));
    comm::WorkPtr logits = control->recv(flat->data(), flat->size(), DType::f32, collector, kLogitsTag);
    auto mine = run_local(system, ranks, work, std::nullopt);
    if (!mine) {
      // The receive may still complete (the collector may yet send) and write into its buffer, and
      // waiting for it could be for ever (the collector may wait on this rank): the failed decoder's
      // process keeps both until it exits.
      keep_until_exit(flat, logits);
      return mine.status();
    }
    if (Status st = logits->wait(); !st) return st.with_context("decode: the logits from rank " + std::to_string(collector) + ": ");
    return split_logits(*work, *flat, vocab);
  }
};

ParallelDecoder::ParallelDecoder(GptConfig config, std::unique_ptr<Impl> impl)
    : config_(std::move(config)), impl_(std::move(impl)) {}

ParallelDecoder::~ParallelDecoder() = default;

Result<std::unique_ptr<ParallelDecoder>> ParallelDecoder::create(const Decoder& whole, const ParallelDecodeOptions& options) {
  const GptConfig& config = whole.config();
  if (const std::string why = check_decoder_layout(config, options.tp, options.pp, options.expert_parallel); !why.empty())
    return Status::bad_input(why);
  TROUPE_CHECK(whole.dtype() == DType::f32, "ParallelDecoder: the whole model must be f32");
  const int size = options.tp * options.pp;
  auto fabric = comm::LocalFabric::create(size);
  if (!fabric) return fabric.status();
  auto impl = std::make_unique<Impl>();
  impl->options = resolved(options);
  std::vector<RankLink> links;
  for (int r = 0; r < size; ++r)
    links.push_back({std::shared_ptr<comm::CommWorld>(fabric.value().world(r)),
                     [f = fabric.value(), r](const std::string& why) { f.abort(r, why); }});
  const int threads = std::max(1, impl->options.num_threads / size);
  if (Status st = spawn_ranks(impl->system, impl->ranks, links, config, impl->options, 0, threads, whole); !st)
    return st;
  return std::unique_ptr<ParallelDecoder>(new ParallelDecoder(config, std::move(impl)));
}

namespace {

// A process rank's checks before it takes part: the layout against the world.
Status check_process_layout(const GptConfig& config, const ParallelDecodeOptions& o, const comm::CommWorld& world) {
  if (const std::string why = check_decoder_layout(config, o.tp, o.pp, o.expert_parallel); !why.empty()) return Status::bad_input(why);
  if (world.size() != o.tp * o.pp)
    return Status::bad_input("tensor " + std::to_string(o.tp) + " x pipeline " + std::to_string(o.pp) + " = " +
                             std::to_string(o.tp * o.pp) + " decode ranks, but troupe launch started " +
                             std::to_string(world.size()) + " processes -- start one process per rank");
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<ParallelDecoder>> ParallelDecoder::create_distributed(const Decoder& whole, const ParallelDecodeOptions& options,
                                                                              std::shared_ptr<comm::CommWorld> world) {
  const GptConfig& config = whole.config();
  TROUPE_CHECK(world && world->rank() == 0, "ParallelDecoder::create_distributed runs on rank 0 (the others follow)");
  TROUPE_CHECK(whole.dtype() == DType::f32, "ParallelDecoder: the whole model must be f32");
  if (Status st = check_process_layout(config, options, *world); !st) return st;
  auto impl = std::make_unique<Impl>();
  impl->options = resolved(options);
  impl->world = world;
  auto control = world->everyone();  // before the rank's own groups, on every process
  if (!control) return control.status();
  impl->control = std::move(control).value();
  if (Status st = spawn_ranks(impl->system, impl->ranks, {{world, nullptr}}, config, impl->options, 0,
                              impl->options.num_threads, whole);
      !st) {
    impl->failed = st;
    return st;
  }
  return std::unique_ptr<ParallelDecoder>(new ParallelDecoder(config, std::move(impl)));
}

Status run_decode_follower(const Decoder& whole, const ParallelDecodeOptions& options_in,
                           std::shared_ptr<comm::CommWorld> world) {
  const GptConfig& config = whole.config();
  TROUPE_CHECK(world && world->rank() > 0, "run_decode_follower runs on ranks other than 0");
  if (Status st = check_process_layout(config, options_in, *world); !st) return st;
  const ParallelDecodeOptions o = resolved(options_in);
  auto control = world->everyone();
  if (!control) return control.status();
  caf::actor_system_config cfg = decode_system_config();
  caf::actor_system system{cfg};
  std::vector<decode_rank_actor> ranks;
  const int rank = world->rank();
  Status status = spawn_ranks(system, ranks, {{world, nullptr}}, config, o, rank, o.num_threads, whole);
  FeedBook book(config);  // rank 0's sequences as this process sees them
  while (status) {
    int64_t size = 0;
    if (status = control.value()->broadcast(&size, 1, DType::i64, 0)->wait(); !status) break;
    if (size == kStopFeeds) break;
    if (size < 0 || size > (int64_t{1} << 32)) {
      status = Status::bad_input("a decode feed of " + std::to_string(size) + " bytes from rank 0");
      break;
    }
    std::string bytes(static_cast<size_t>(size), '\0');
    if (status = control.value()->broadcast(bytes.data(), bytes.size(), DType::u8, 0)->wait(); !status) break;
    auto parsed = parse_decode_work(bytes, config.vocab_size);
    if (!parsed) {
      status = parsed.status();
      break;
    }
    const auto work = std::make_shared<const DecodeWork>(std::move(parsed).value());
    if (status = book.accept(*work); !status) break;
    const bool collects = rank == collector_rank(o);
    auto logits = run_local(system, ranks, work, collects ? std::optional<size_t>(0) : std::nullopt);
    if (!logits) {
      status = logits.status();
      break;
    }
    if (collects && !logits.value().empty()) {
      std::vector<float> flat;
      for (const auto& l : logits.value()) flat.insert(flat.end(), l.begin(), l.end());
      status = control.value()->send(flat.data(), flat.size(), DType::f32, 0, kLogitsTag)->wait();
    }
  }
  caf::scoped_actor self{system};
  for (const auto& r : ranks) self->send_exit(r, caf::exit_reason::user_shutdown);
  return status;
}

int ParallelDecoder::open_sequence() {
  const int id = book_.open();
  impl_->pending.push_back({SlotOp::open, id, 0});
  return id;
}

void ParallelDecoder::close_sequence(int id) {
  book_.close(id);
  impl_->pending.push_back({SlotOp::close, id, 0});
}

int ParallelDecoder::copy_sequence(int from) {
  TROUPE_CHECK(book_.is_open(from), "ParallelDecoder: no sequence " + std::to_string(from));
  const int id = book_.open();
  book_.grow(id, book_.length(from));
  impl_->pending.push_back({SlotOp::copy, id, from});
  return id;
}

int64_t ParallelDecoder::length(int id) const { return book_.length(id); }

Result<std::vector<std::vector<float>>> ParallelDecoder::feed_each(Context& ctx, const std::vector<int>& ids,
                                                                   const std::vector<std::vector<int32_t>>& tokens,
                                                                   const std::vector<uint8_t>& every) {
  (void)ctx;
  if (every.size() != ids.size()) return Status::bad_input("ParallelDecoder::feed: one every-token flag per sequence");
  if (!impl_->failed) return impl_->failed;
  auto rows = plan_feed(config_, ids, tokens, [&](int id) { return book_.is_open(id); },
                        [&](int id) { return book_.length(id); });
  if (!rows) return rows.status();
  auto work = std::make_shared<DecodeWork>();
  work->ops = std::move(impl_->pending);
  impl_->pending.clear();
  work->rows = rows.value();
  work->tokens = tokens;
  work->every = every;
  work->group_end = split_micro_batches(work->rows.row0, impl_->options.micro_batches);
  auto logits = impl_->run(work, config_.vocab_size);
  if (!logits) {
    impl_->failed = logits.status();
    return logits.status();
  }
  for (size_t i = 0; i < ids.size(); ++i) book_.grow(ids[i], static_cast<int64_t>(tokens[i].size()));
  return logits;
}

}  // namespace troupe
