#include "model/pipeline_model.hpp"

#include <map>
#include <set>

#include "model/custom_stage.hpp"
#include "model/gpt_stage.hpp"
#include "model/sequence_stage.hpp"
#include "troupe/check.hpp"
#include "troupe/train_config.hpp"

namespace troupe {

Block Block::gpt(int first_layer, int num_layers, bool embedding, bool head) {
  Block b;
  b.kind = Kind::gpt;
  b.first_layer = first_layer;
  b.num_layers = num_layers;
  b.embedding = embedding;
  b.head = head;
  return b;
}

Block Block::custom(std::string name, StageFactory make) {
  Block b;
  b.kind = Kind::custom;
  b.name = std::move(name);
  b.make = std::move(make);
  return b;
}

Model gpt_model(const GptConfig& gpt, int virtual_stages, bool with_head) {
  Model m;
  for (int k = 0; k < virtual_stages; ++k) {
    const ChunkSpec cs = chunk_layers(gpt, virtual_stages, 1, k, 0);
    m.stages.push_back({Block::gpt(cs.first_layer, cs.num_layers, cs.has_embedding, cs.has_head && with_head)});
  }
  return m;
}

Model gpt_model(const TrainConfig& c, bool with_head) {
  const int pp = std::max(1, c.pipeline_model_parallel_size);
  const int per_chunk = c.num_layers_per_virtual_pipeline_stage;
  const int v = per_chunk > 0 ? std::max(1, c.model.num_layers / (pp * per_chunk)) : 1;
  return gpt_model(c.model, pp * v, with_head);
}

Result<Model> gpt_model(const TrainConfig& c, const std::vector<Insertion>& insertions, bool with_head) {
  const int L = c.model.num_layers;
  for (const Insertion& at : insertions)
    if (at.after_layer < -1 || at.after_layer >= L)
      return Status::bad_input("an insertion after layer " + std::to_string(at.after_layer) + ": GPT has layers 0.." +
                               std::to_string(L - 1) + " -- use -1 (right after the embedding) to " +
                               std::to_string(L - 1) + " (after the last layer, before GPT's head)");
  Model split = gpt_model(c, with_head);
  Model m;
  m.loss_terms_per_sample = split.loss_terms_per_sample;
  for (const std::vector<Block>& stage : split.stages) {
    const Block& g = stage.front();  // gpt_model gives one GPT block per virtual stage
    const int first = g.first_layer, end = g.first_layer + g.num_layers;
    std::vector<Block> blocks;
    int cur = first;
    bool embedding = g.embedding;
    // Insertions after layer j sit on the stage holding layer j (the embedding's for -1), in order.
    for (int j = embedding ? -1 : first; j < end; ++j)
      for (const Insertion& at : insertions) {
        if (at.after_layer != j) continue;
        if (j + 1 > cur || embedding) blocks.push_back(Block::gpt(cur, j + 1 - cur, embedding, false));
        embedding = false;
        cur = j + 1;
        blocks.push_back(at.block);
      }
    if (end > cur || embedding || g.head) blocks.push_back(Block::gpt(cur, end - cur, embedding, g.head));
    m.stages.push_back(std::move(blocks));
  }
  return m;
}

bool has_gpt_blocks(const Model& model) {
  for (const auto& stage : model.stages)
    for (const Block& b : stage)
      if (b.kind == Block::Kind::gpt && (b.num_layers > 0 || b.embedding || b.head)) return true;
  return false;
}

Model single_stage(const Model& model) {
  Model one;
  one.loss_terms_per_sample = model.loss_terms_per_sample;
  one.stages.emplace_back();
  std::vector<Block>& blocks = one.stages.front();
  for (const auto& stage : model.stages)
    for (const Block& b : stage) {
      if (!blocks.empty() && b.kind == Block::Kind::gpt && blocks.back().kind == Block::Kind::gpt &&
          !blocks.back().head && !b.embedding && blocks.back().first_layer + blocks.back().num_layers == b.first_layer) {
        blocks.back().num_layers += b.num_layers;
        blocks.back().head = b.head;
        continue;
      }
      blocks.push_back(b);
    }
  return one;
}

bool ties_embedding(const Model& model) {
  if (model.stages.empty() || model.stages.front().empty() || model.stages.back().empty()) return false;
  if (model.stages.size() == 1 && model.stages.front().size() == 1) return false;  // one chunk, one wte
  const Block& first = model.stages.front().front();
  const Block& last = model.stages.back().back();
  return first.kind == Block::Kind::gpt && first.embedding && last.kind == Block::Kind::gpt && last.head;
}

namespace {

ChunkSpec gpt_chunk_spec(const Block& b, const StageBuild& at) {
  ChunkSpec cs;
  cs.model = at.gpt;
  cs.first_layer = b.first_layer;
  cs.num_layers = b.num_layers;
  cs.has_embedding = b.embedding;
  cs.has_head = b.head;
  cs.tp_size = at.tp_size;
  cs.tp_rank = at.tp_rank;
  cs.sequence_parallel = at.sequence_parallel && at.tp_size > 1;
  cs.expert_tensor_parallel = at.expert_tensor_parallel;
  cs.ep_size = at.ep_size;
  cs.ep_rank = at.ep_rank;
  cs.cp_size = at.cp_size;
  cs.cp_rank = at.cp_rank;
  cs.cp_comm = at.cp_comm;
  cs.cp_contiguous = at.cp_contiguous;
  cs.recompute = at.recompute;
  cs.micro_batch = at.micro_batch;
  cs.slots = at.slots;
  cs.dtype = at.dtype;
  cs.grad_dtype = at.grad_dtype;
  cs.device = at.device;
  return cs;
}

StagePlace place_of(const StageBuild& at) {
  StagePlace p;
  p.virtual_stage = at.virtual_stage;
  p.virtual_stages = at.virtual_stages;
  p.tp_rank = at.tp_rank;
  p.tp_size = at.tp_size;
  p.micro_batch = at.micro_batch;
  p.record_length = int64_t{at.gpt.seq_length} + 1;
  p.slots = at.slots;
  p.hidden_size = at.gpt.hidden_size;
  p.vocab_size = at.gpt.vocab_size;
  return p;
}

std::unique_ptr<PipelineStage> build_block(const Block& b, const StageBuild& at, UnitHooks hooks, bool tied) {
  if (b.kind == Block::Kind::gpt)
    return std::make_unique<GptStage>(gpt_chunk_spec(b, at), at.tp, std::move(hooks), tied, at.ep, at.cp);
  return std::make_unique<CustomStage>(b.make(place_of(at)), place_of(at), at.tp, std::move(hooks), at.recompute,
                                       at.dtype, b.name);
}

// A block's declarations, as check_model reads them (custom stages built once at tp rank 0).
struct Declared {
  std::string what;  // "virtual stage 1, block 0 (custom \"head\")"
  std::string block_name;  // a custom block's name
  std::vector<BoundaryDecl> in, out;
  std::vector<ParamDecl> params;
  bool loss = false, custom = false;
};

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + ")";
}

bool good_shape(const std::vector<int64_t>& s) {
  if (s.empty() || s.size() > static_cast<size_t>(Shape::kMaxRank)) return false;
  for (int64_t d : s)
    if (d <= 0) return false;
  return true;
}

}  // namespace

Status check_model(const Model& model, const StageBuild& job, int pp, int v, std::vector<StageFootprint>* footprint) {
  if (footprint != nullptr) footprint->assign(model.stages.size(), StageFootprint{});
  std::vector<std::string> problems;
  const size_t want = static_cast<size_t>(pp) * static_cast<size_t>(v);
  if (model.stages.size() != want)
    problems.push_back("the model has " + std::to_string(model.stages.size()) + " virtual stages but the job runs " +
                       std::to_string(pp) + " pipeline stages x " + std::to_string(v) +
                       " chunks = " + std::to_string(want) + " -- give one entry of Model::stages per virtual stage");
  if (model.loss_terms_per_sample < 0)
    problems.push_back("Model::loss_terms_per_sample is " + std::to_string(model.loss_terms_per_sample) +
                       " -- use 0 (seq_length) or the loss terms of one sample");
  std::vector<Declared> blocks;
  const GptConfig& g = job.gpt;
  int next_layer = 0;
  bool any_custom = false;
  for (size_t k = 0; k < model.stages.size(); ++k) {
    if (model.stages[k].empty()) problems.push_back("virtual stage " + std::to_string(k) + " has no block -- give it one");
    for (size_t i = 0; i < model.stages[k].size(); ++i) {
      const Block& b = model.stages[k][i];
      Declared d;
      d.what = "virtual stage " + std::to_string(k) + ", block " + std::to_string(i);
      if (b.kind == Block::Kind::gpt) {
        d.what += " (GPT layers " + std::to_string(b.first_layer) + ".." + std::to_string(b.first_layer + b.num_layers - 1) + ")";
        if (b.first_layer != next_layer || b.num_layers < 0 || b.first_layer + b.num_layers > g.num_layers)
          problems.push_back(d.what + ": GPT blocks hold the model's layers in order, each once (this one should start at layer " +
                             std::to_string(next_layer) + " of " + std::to_string(g.num_layers) +
                             ") -- use troupe::gpt_model for GPT's split");
        next_layer = b.first_layer + std::max(0, b.num_layers);
        const int64_t rows = int64_t{job.micro_batch} * g.seq_length;
        const BoundaryDecl hidden{"hidden", Shape{rows, g.hidden_size}, DType::f32, true};
        if (!b.embedding) d.in.push_back(hidden);
        if (!b.head) d.out.push_back(hidden);
        d.loss = b.head;
      } else {
        d.what += " (custom \"" + b.name + "\")";
        d.block_name = b.name;
        d.custom = any_custom = true;
        if (b.name.empty()) problems.push_back(d.what + ": a custom block needs a name -- pass one to Block::custom");
        if (!b.make) {
          problems.push_back(d.what + ": no factory -- pass one to Block::custom");
        } else {
          StageBuild at = job;
          at.virtual_stage = static_cast<int>(k);
          at.tp_rank = 0;
          std::unique_ptr<troupe::Stage> s;
          try {
            s = b.make(place_of(at));
          } catch (const std::exception& e) {
            problems.push_back(d.what + ": its factory threw: " + e.what());
          }
          if (s) {
            for (const TensorDecl& t : s->inputs()) d.in.push_back(boundary_decl(t));
            for (const TensorDecl& t : s->outputs()) d.out.push_back(boundary_decl(t));
            for (const TensorDecl& t : s->inputs())
              if (!good_shape(t.shape))
                problems.push_back(d.what + ": input " + t.name + " has shape " + shape_str(t.shape) +
                                   " -- give 1 to 6 positive dimensions");
            for (const TensorDecl& t : s->outputs())
              if (!good_shape(t.shape))
                problems.push_back(d.what + ": output " + t.name + " has shape " + shape_str(t.shape) +
                                   " -- give 1 to 6 positive dimensions");
            d.params = s->parameters();
            d.loss = s->has_loss();
            if (s->has_loss() && !d.out.empty())
              problems.push_back(d.what + ": has the loss but declares outputs -- the loss block is the model's last");
          } else if (b.make) {
            problems.push_back(d.what + ": its factory returned no stage");
          }
        }
      }
      if (footprint != nullptr) {
        StageFootprint& f = (*footprint)[k];
        if (b.kind == Block::Kind::gpt) {
          f.gpt_layers += std::max(0, b.num_layers);
          f.embedding = f.embedding || b.embedding;
          f.head = f.head || b.head;
        } else {
          for (const ParamDecl& p : d.params) {
            double n = 1;
            for (int64_t x : p.shape) n *= static_cast<double>(x);
            f.custom_parameters += p.tp_split_dim >= 0 ? n / std::max(1, job.tp_size) : n;
          }
          for (const auto* list : {&d.in, &d.out})
            for (const BoundaryDecl& t : *list) {
              double n = 1;  // in double: a declared shape's product may not fit in int64
              for (int64_t x : t.shape) n *= static_cast<double>(x);
              f.custom_boundary_elements += n;
            }
        }
      }
      blocks.push_back(std::move(d));
    }
  }
  if (next_layer != 0 && next_layer != g.num_layers)
    problems.push_back("the GPT blocks hold layers 0.." + std::to_string(next_layer - 1) + " of " +
                       std::to_string(g.num_layers) + " -- place every layer of --num-layers in a block");
  if (any_custom && job.sequence_parallel && job.tp_size > 1)
    problems.push_back("--sequence-parallel splits GPT's rows over the tensor-parallel ranks, which custom blocks do not "
                       "take -- drop --sequence-parallel");
  if (any_custom && job.cp_size > 1)
    problems.push_back("--context-parallel-size splits GPT's sequences over ranks, which custom blocks do not take -- "
                       "drop --context-parallel-size");
  if (any_custom && job.dtype != DType::f32)
    problems.push_back("custom blocks compute in f32 only: train a model with custom blocks without --bf16 / --fp16");
  std::map<std::string, std::string> first_use;  // a parameter's name -> the block that declared it first
  for (size_t i = 0; i < blocks.size(); ++i) {
    const Declared& d = blocks[i];
    const bool first = i == 0, last = i + 1 == blocks.size();
    if (first && !d.in.empty())
      problems.push_back(d.what + ": the model's first block takes " + describe(d.in) +
                         " but nothing comes before it -- it reads the batch instead");
    if (!first && blocks[i - 1].out != d.in)
      problems.push_back(d.what + " takes " + describe(d.in) + " but " + blocks[i - 1].what + " gives " +
                         describe(blocks[i - 1].out) + " -- make the names, shapes and types agree");
    if (last && !d.loss) problems.push_back(d.what + ": the model's last block must have the loss (has_loss)");
    if (!last && d.loss) problems.push_back(d.what + ": only the model's last block may have the loss");
    for (const ParamDecl& p : d.params) {
      if (p.name.empty()) {
        problems.push_back(d.what + ": a parameter has no name -- give every parameter a global name of its own, "
                           "e.g. \"" + (d.custom ? d.block_name : std::string("block")) + ".weight\"");
      } else if (p.name.rfind("transformer.", 0) == 0 || p.name.rfind("lm_head.", 0) == 0) {
        problems.push_back(d.what + ": parameter name \"" + p.name +
                           "\" is reserved: names under transformer. and lm_head. are GPT's own parameters (and "
                           "its checkpoints') -- choose another prefix, e.g. the block's name");
      } else if (const auto [it, fresh] = first_use.emplace(p.name, d.what); !fresh) {
        problems.push_back(d.what + ": parameter name \"" + p.name + "\" is used twice: " +
                           (it->second == d.what ? std::string("this block declares it") : it->second) +
                           " declares it first -- give every parameter its own name (checkpoints hold parameters "
                           "by name)");
      }
      if (!good_shape(p.shape)) {
        problems.push_back(d.what + ": parameter " + p.name + " has shape " + shape_str(p.shape) +
                           " -- give 1 to 6 positive dimensions");
        continue;
      }
      if (p.tp_split_dim >= static_cast<int>(p.shape.size()) || p.tp_split_dim < -1)
        problems.push_back(d.what + ": parameter " + p.name + " splits dimension " + std::to_string(p.tp_split_dim) +
                           " of " + shape_str(p.shape) + " -- use -1 (replicated) or a dimension index");
      else if (p.tp_split_dim >= 0 && p.shape[p.tp_split_dim] % job.tp_size != 0)
        problems.push_back(d.what + ": parameter " + p.name + " splits dimension " + std::to_string(p.tp_split_dim) +
                           " of " + shape_str(p.shape) + " over " + std::to_string(job.tp_size) +
                           " tensor-parallel ranks, which do not divide it -- change the size or the split");
      if (p.init == ParamDecl::Init::normal && !(p.init_std >= 0))
        problems.push_back(d.what + ": parameter " + p.name + " has init_std " + std::to_string(p.init_std) +
                           " -- use a non-negative standard deviation");
    }
  }
  if (problems.empty()) return Status::ok();
  std::string msg = "the model given in code cannot run:";
  for (const std::string& p : problems) msg += "\n  " + p;
  return Status::bad_input(msg);
}

std::unique_ptr<PipelineStage> build_stage(const Model& model, const StageBuild& at, const UnitHooks& hooks) {
  const std::vector<Block>& blocks = model.stages.at(static_cast<size_t>(at.virtual_stage));
  const bool tied = ties_embedding(model);
  if (blocks.size() == 1) return build_block(blocks.front(), at, hooks, tied);
  return std::make_unique<SequenceStage>(
      static_cast<int>(blocks.size()),
      [&](int i, UnitHooks h) { return build_block(blocks[static_cast<size_t>(i)], at, std::move(h), tied); }, hooks,
      at.slots);
}

}  // namespace troupe
