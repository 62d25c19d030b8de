// Parallel decoding (docs/SERVE.md, "Layouts"): the decoder as t x p shard actors, like training's
// ranks. Rank stage * t + r holds tensor-parallel rank r of pipeline stage `stage`
// (model/decoder_shard.hpp: its heads' key/value cache, its slice of every linear), on a detached
// actor of its own (its own thread and compute pool), with the communicators of its tensor-parallel
// group and of its pipeline (a local fabric: the ranks are threads of this process).
//
// Each feed is one message to every rank, in the same order to all (their collectives match). A
// feed's sequences are cut into micro-batches (at most p, by rows); stage s embeds (s = 0) or
// receives micro-batch k, runs its layers, and sends it on while it goes on with k + 1, so the p
// stages work on different micro-batches at once; the last stage's tensor-parallel rank 0 replies
// with the logits. Opening, closing and copying sequences travel with the next feed.
//
// The ranks may also be processes (troupe launch, one rank each, over UCX): rank 0 holds the
// decoder and its own rank's actor, broadcasts each feed's bytes (model/decode_work.hpp) to the
// other processes, whose run_decode_follower hands them to their rank's actor; the collector sends
// its logits to rank 0.
//
// A rank that fails (a bug, memory) aborts the fabric: every other rank's pending exchange fails,
// each replies the error, the feed returns it, and the decoder refuses every later feed. Nothing
// waits for ever.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/world.hpp"
#include "model/decoder.hpp"
#include "troupe/status.hpp"

namespace troupe {

struct ParallelDecodeOptions {
  int tp = 1, pp = 1;
  int num_threads = 0;    // compute threads of all the ranks together (0: every core); each rank gets its share
  int micro_batches = 0;  // a feed's sequences split into at most this many groups (0: pp)
  DType dtype = DType::f32;  // the shards' (model/decoder_shard.hpp): f32, bf16 or f16
  bool expert_parallel = false;  // experts whole, E/tp per tensor-parallel rank (DecoderShardSpec)
};

class ParallelDecoder : public SequenceDecoder {
 public:
  // t x p shard actors filled from `whole` (an f32 Decoder holding the whole model; it may be freed
  // once this returns). Bad input when the model cannot be split so (check_decoder_layout's reasons).
  static Result<std::unique_ptr<ParallelDecoder>> create(const Decoder& whole, const ParallelDecodeOptions& options);
  // The ranks as the processes of a `troupe launch` (one rank each, world rank = stage * t + tensor rank;
  // `world` their UCX world, of t x p processes): this is rank 0's decoder, whose feeds it broadcasts
  // to the others, which run run_decode_follower until it is destroyed. Every process holds `whole`.
  static Result<std::unique_ptr<ParallelDecoder>> create_distributed(const Decoder& whole, const ParallelDecodeOptions& options,
                                                                     std::shared_ptr<comm::CommWorld> world);
  ~ParallelDecoder() override;
  ParallelDecoder(const ParallelDecoder&) = delete;
  ParallelDecoder& operator=(const ParallelDecoder&) = delete;

  const GptConfig& config() const override { return config_; }
  int open_sequence() override;
  void close_sequence(int id) override;
  int copy_sequence(int id) override;
  int64_t length(int id) const override;
  // `ctx` is not used: each rank computes on its own pool.
  Result<std::vector<std::vector<float>>> feed_each(Context& ctx, const std::vector<int>& ids,
                                                    const std::vector<std::vector<int32_t>>& tokens,
                                                    const std::vector<uint8_t>& every) override;

  struct Impl;

 private:
  ParallelDecoder(GptConfig config, std::unique_ptr<Impl> impl);
  GptConfig config_;
  std::unique_ptr<Impl> impl_;
  SequenceBook book_;
};

// The other processes' side of create_distributed: this process's rank takes part in each feed rank 0
// broadcasts (checked as rank 0 checked it: parse_decode_work, then plan_feed against the sequences
// its changes open) and, as the collector, sends rank 0 the logits; returns when rank 0's decoder is
// destroyed (ok) or the job fails (why).
Status run_decode_follower(const Decoder& whole, const ParallelDecodeOptions& options, std::shared_ptr<comm::CommWorld> world);

}  // namespace troupe
