// actors/decode_actors.hpp.
#include "actors/decode_actors.hpp"

#include <algorithm>
#include <thread>

#include <caf/all.hpp>

#include "actors/errors.hpp"
#include "actors/messages.hpp"
#include "comm/local/local_world.hpp"
#include "kernels/thread_pool.hpp"
#include "model/decoder_shard.hpp"

namespace troupe {

void configure_blas_threads();

namespace {

// A change to the sequences, applied by every rank before the feed it travels with.
struct SlotOp {
  enum Kind : uint8_t { open, close, copy } kind = open;
  int id = 0, from = 0;  // copy: `from` into `id`
};

struct DecodeWork {
  std::vector<SlotOp> ops;
  DecodeRows rows;  // empty: the ops only
  std::vector<std::vector<int32_t>> tokens;
  std::vector<uint8_t> every;  // per sequence: the logits of every new row, or of its last
  std::vector<size_t> group_end;  // micro-batch k holds sequences [group_end[k-1], group_end[k])
};
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
  std::unique_ptr<comm::CommWorld> world;
  std::unique_ptr<comm::Communicator> tp, pp;
  std::unique_ptr<ThreadPool> pool;
  Context ctx;
  std::unique_ptr<DecoderShard> shard;
  Status created;
};

decode_rank_actor::behavior_type decode_rank(decode_rank_actor::stateful_pointer<DecodeRankState> self,
                                             comm::LocalFabric fabric, GptConfig config, ParallelDecodeOptions o,
                                             int rank, int threads, const Decoder* whole) {
  configure_blas_threads();
  name_exceptions(self, "decode rank " + std::to_string(rank));
  auto& st = self->state;
  st.rank = rank;
  const int stage = rank / o.tp, tp_rank = rank % o.tp;
  st.world = fabric.world(rank);
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
    st.shard = std::make_unique<DecoderShard>(config, spec, st.tp.get());
    // The whole model's tensors, read while create() waits for every rank's init.
    st.shard->load_from_whole([whole](const std::string& name) { return whole->param(name); });
  }
  auto fail = [self, fabric](const std::string& why) {
    const std::string what = "decode rank " + std::to_string(self->state.rank) + ": " + why;
    fabric.abort(self->state.rank, what);
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

}  // namespace

struct ParallelDecoder::Impl {
  ParallelDecodeOptions options;
  caf::actor_system_config config = decode_system_config();
  caf::actor_system system{config};
  std::vector<decode_rank_actor> ranks;
  std::vector<SlotOp> pending;  // sequence changes not yet sent
  Status failed;                // a feed failed: the fabric is gone

  ~Impl() {
    caf::scoped_actor self{system};
    for (const auto& r : ranks) self->send_exit(r, caf::exit_reason::user_shutdown);
  }

  // Sends `work` to every rank and waits for all; the last stage's tp rank 0's logits.
  Result<std::vector<std::vector<float>>> run(const DecodeWorkPtr& work) {
    caf::scoped_actor self{system};
    Status status;
    std::vector<std::vector<float>> logits;
    const size_t collector = ranks.size() - static_cast<size_t>(options.tp);  // last stage, tp rank 0
    std::vector<decltype(self->request(ranks[0], caf::infinite, decode_atom::value, work))> handles;
    for (const auto& r : ranks) handles.push_back(self->request(r, caf::infinite, decode_atom::value, work));
    for (size_t i = 0; i < handles.size(); ++i)
      handles[i].receive(
          [&](DecodeReply& reply) {
            if (i == collector) logits = std::move(reply.logits);
          },
          [&](caf::error& err) {
            if (status) status = to_status(err);
          });
    if (!status) return status;
    return logits;
  }
};

ParallelDecoder::ParallelDecoder(GptConfig config, std::unique_ptr<Impl> impl)
    : config_(std::move(config)), impl_(std::move(impl)) {}

ParallelDecoder::~ParallelDecoder() = default;

Result<std::unique_ptr<ParallelDecoder>> ParallelDecoder::create(const Decoder& whole, const ParallelDecodeOptions& options) {
  const GptConfig& config = whole.config();
  if (const std::string why = check_decoder_layout(config, options.tp, options.pp); !why.empty())
    return Status::bad_input(why);
  TROUPE_CHECK(whole.dtype() == DType::f32, "ParallelDecoder: the whole model must be f32");
  const int size = options.tp * options.pp;
  auto fabric = comm::LocalFabric::create(size);
  if (!fabric) return fabric.status();
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  if (impl->options.micro_batches <= 0) impl->options.micro_batches = options.pp;
  const int cores = options.num_threads > 0 ? options.num_threads
                                            : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const int threads = std::max(1, cores / size);
  for (int r = 0; r < size; ++r)
    impl->ranks.push_back(impl->system.spawn<caf::detached>(decode_rank, fabric.value(), config, impl->options, r,
                                                            threads, &whole));
  Status status;
  {
    caf::scoped_actor self{impl->system};
    for (const auto& r : impl->ranks)
      self->request(r, caf::infinite, init_atom::value)
          .receive([](ok_atom) {},
                   [&](caf::error& err) {
                     if (status) status = to_status(err);
                   });
  }
  if (!status) return status;
  return std::unique_ptr<ParallelDecoder>(new ParallelDecoder(config, std::move(impl)));
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
  // Micro-batches of about equal rows, each at least one sequence.
  const size_t S = ids.size(), m = std::min(S, static_cast<size_t>(impl_->options.micro_batches));
  const int64_t R = work->rows.rows();
  size_t end = 0;
  for (size_t k = 1; k < m; ++k) {
    const int64_t target = R * static_cast<int64_t>(k) / static_cast<int64_t>(m);
    ++end;
    while (end < S && work->rows.row0[end] < target) ++end;
    end = std::min(end, S - (m - k));  // room for the groups after
    work->group_end.push_back(end);
  }
  work->group_end.push_back(S);
  auto logits = impl_->run(work);
  if (!logits) {
    impl_->failed = logits.status();
    return logits.status();
  }
  for (size_t i = 0; i < ids.size(); ++i) book_.grow(ids[i], static_cast<int64_t>(tokens[i].size()));
  return logits;
}

}  // namespace troupe
