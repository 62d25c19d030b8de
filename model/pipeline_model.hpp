// A troupe::Model (include/troupe/stage.hpp) as the engine builds it: the checks a model passes
// before any rank is built, and the PipelineStage (model/stage.hpp) of one virtual stage.
#pragma once
#include <memory>

#include "model/footprint.hpp"
#include "model/stage.hpp"
#include "troupe/stage.hpp"

namespace troupe {

// What a virtual stage's blocks are built with, besides the blocks themselves.
struct StageBuild {
  GptConfig gpt;
  int virtual_stage = 0, virtual_stages = 1;
  int tp_size = 1, tp_rank = 0;
  bool sequence_parallel = false;
  bool expert_tensor_parallel = true;  // ChunkSpec::expert_tensor_parallel
  int ep_size = 1, ep_rank = 0;        // ChunkSpec's; ep: the expert-parallel group (null: ep_size 1)
  comm::Communicator* ep = nullptr;
  int cp_size = 1, cp_rank = 0;        // ChunkSpec's; cp: the context-parallel group (null: cp_size 1)
  CpComm cp_comm = CpComm::p2p;
  bool cp_contiguous = false;          // ChunkSpec's (Ulysses' layout)
  comm::Communicator* cp = nullptr;
  Recompute recompute = Recompute::none;
  int micro_batch = 1, slots = 1;
  DType dtype = DType::f32;
  DType grad_dtype = DType::f32;  // with a 16-bit dtype: the gradients' (ChunkSpec::grad_dtype)
  Device device = Device::cpu;    // ChunkSpec::device (GPT blocks only: check_model refuses custom ones)
  comm::Communicator* tp = nullptr;
};

// GPT's own split over `virtual_stages` (chunk_layers' rule), as gpt_model returns it.
Model gpt_model(const GptConfig& gpt, int virtual_stages, bool with_head = true);

// Every problem of `model` for a job of pp stages x v chunks with tensor-parallel size tp, at once,
// as bad input: the count of virtual stages, empty stages, GPT blocks outside the model or out of
// order, the embedding or GPT's head away from the model's ends, tensors that do not chain from one
// block to the next (names, shapes, types), the loss not on the last block, parameter names used
// twice, tensor-parallel splits that tp does not divide, sequence parallelism beside custom
// blocks. Builds each custom stage once (tp rank 0) to read its declarations.
// footprint (when given): filled with each virtual stage's StageFootprint (model/footprint.hpp),
// for the memory estimate; meaningful only when the check passes.
Status check_model(const Model& model, const StageBuild& job, int pp, int v,
                   std::vector<StageFootprint>* footprint = nullptr);

// Whether the model has any of GPT's blocks (layers, the embedding or the head): GPT's architecture
// rules and the GPT tensors of its checkpoints apply only then.
bool has_gpt_blocks(const Model& model);

// The model's blocks in order on one virtual stage (a model of any layout, for one rank), adjacent
// GPT blocks that continue each other merged into one.
Model single_stage(const Model& model);

// The model ties GPT's output layer to the token embedding across blocks: its first block is GPT's
// embedding and its last GPT's head, and they are two blocks (a chunk holding both has one wte).
bool ties_embedding(const Model& model);

// The stage of virtual stage build.virtual_stage: its one block, or its blocks in sequence.
std::unique_ptr<PipelineStage> build_stage(const Model& model, const StageBuild& build, const UnitHooks& hooks);

}  // namespace troupe
