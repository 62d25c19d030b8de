// A checkpoint loaded whole for generation (troupe generate, troupe serve): its model as a Decoder and
// its tokenizer, both from the checkpoint's stored training config.
#pragma once
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "comm/bootstrap/caf_bootstrap.hpp"
#include "comm/world.hpp"
#include "model/decoder.hpp"
#include "storage/tokenizer.hpp"
#include "troupe/status.hpp"

namespace troupe::apps {

struct GenerationModel {
  std::unique_ptr<SequenceDecoder> decoder;  // a Decoder, or a ParallelDecoder (tp x pp > 1)
  std::unique_ptr<Tokenizer> tokenizer;
  int64_t iteration = 0;
};

// How the model is decoded: tp x pp shard actors (actors/decode_actors.hpp) or, 1 x 1, one decoder.
struct DecodeLayout {
  int tp = 1, pp = 1;
  int ep = 1;  // --expert-model-parallel-size: 1, or tp (the experts whole, spread over the tensor-parallel group)
  int num_threads = 0;  // 0: every core
  DType dtype = DType::f32;  // --bf16, --fp16: the 16-bit forward (model/decoder_shard.hpp)
  bool bf16 = false, fp16 = false;  // the flags, resolved into dtype by load_generation_model
  // The ranks as processes (troupe launch, one per rank): their world, rank 0's; null in one process.
  std::shared_ptr<comm::CommWorld> world;
};

// The processes of a decoding job (troupe launch --nproc-per-node N, or another launcher), joined:
// the bootstrap (declared first: it outlives the world) and the UCX world; both null in one process.
struct DecodeProcesses {
  std::unique_ptr<comm::CafBootstrap> bootstrap;
  std::shared_ptr<comm::CommWorld> world;
  int local_world_size = 1;
  bool follower() const { return world && world->rank() > 0; }
};
// Joins the job when it has more than one process (nothing otherwise): sets layout.world and, where
// num_threads (the --num-threads given) is 0, layout.num_threads to this process's share of the
// host's cores. Errors name the launcher's variable or the connection and the fix.
Result<DecodeProcesses> join_decode_processes(DecodeLayout& layout, int num_threads);
// A process other than rank 0: reads the model whole, takes its rank's part of every feed rank 0
// sends and returns its exit code when rank 0 is done (errors printed under `name`).
int follow_decode(const std::string& name, const std::string& dir, int64_t iteration, const DecodeLayout& layout,
                  const DecodeProcesses& procs);

// iteration < 0: the latest. Bad input naming --load and the fix: not a checkpoint, a model generation
// does not run (MoE), a tokenizer whose vocabulary is not the model's, a layout the model cannot be
// split into (all of the layout's problems).
Result<GenerationModel> load_generation_model(const std::string& dir, int64_t iteration, const DecodeLayout& layout = {});

// Megatron's --tensor-model-parallel-size, --pipeline-model-parallel-size, --bf16 and --fp16 on `cmd`.
void add_decode_layout_options(CLI::App* cmd, DecodeLayout& layout);

}  // namespace troupe::apps
