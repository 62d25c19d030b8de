// troupe's training as an actor of your own CAF actor system (CAF 0.17, Debian's libcaf-dev): your
// actors make the batches, send them as typed messages and get the results back as messages.
//
//   caf::actor_system_config cfg; caf::actor_system system{cfg};
//   auto training = troupe::spawn_training(system, train_config);   // Result<training_actor>
//   caf::scoped_actor self{system};
//   self->request(*training, caf::infinite, troupe::train_batch_atom::value, batch)
//       .receive([](const troupe::IterationStats& s) { ... }, [](caf::error& e) { ... });
//
// The training actor owns the job's rank actors (the config's tensor x pipeline x data layout, all
// in this process on the in-process backend, each on a thread of its own) and their optimizer
// partitions; it handles one message at a time, in mailbox order, and answers each request once the
// ranks have. Its interface:
//   (train_batch_atom, TokenBatch)  -> IterationStats   one optimizer step on this global batch
//   (eval_batch_atom, TokenBatch)   -> EvalStats        the mean loss of these windows, no update
//   (save_to_atom, std::string dir) -> SavedCheckpoint  a checkpoint of the current state in dir
//                                                       (troupe's format: any layout, troupe train
//                                                       --load and troupe eval read it)
//   (state_atom)                    -> TrainingState
// A batch of the wrong shape or with tokens outside the vocabulary is answered with an error (a
// caf::error whose message names the problem), and the actor goes on. When the training actor
// exits (send it an exit message, or drop every handle to it) its ranks exit too.
// Messages are local to the process (TokenBatch is not meant to cross a network).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "troupe/reports.hpp"
#include "troupe/schedule.hpp"
#include "troupe/stage.hpp"
#include "troupe/status.hpp"
#include "troupe/train_config.hpp"

namespace troupe {

// Windows of seq_length + 1 tokens, row after row (a window's first seq_length tokens are inputs,
// its last seq_length the next-token targets). A training batch holds global_batch_size windows.
struct TokenBatch {
  int64_t sequences = 0;
  std::vector<int32_t> tokens;  // sequences * (seq_length + 1) token ids
};

struct TrainingState {
  int64_t iteration = 0;         // optimizer steps taken (from the checkpoint of config.load, or 0)
  int64_t consumed_samples = 0;  // windows trained on
  double next_lr = 0;            // the learning rate of the next step
  int world_size = 1;            // rank actors of the layout
  std::string layout;            // the topology, e.g. "tp=2 cp=1 ep=1 dp=1 pp=2 (world 4, ...)"
};

using train_batch_atom = caf::atom_constant<caf::atom("trbatch")>;
using eval_batch_atom = caf::atom_constant<caf::atom("evbatch")>;
using save_to_atom = caf::atom_constant<caf::atom("saveto")>;
using state_atom = caf::atom_constant<caf::atom("state")>;

using training_actor = caf::typed_actor<caf::replies_to<train_batch_atom, TokenBatch>::with<IterationStats>,
                                        caf::replies_to<eval_batch_atom, TokenBatch>::with<EvalStats>,
                                        caf::replies_to<save_to_atom, std::string>::with<SavedCheckpoint>,
                                        caf::replies_to<state_atom>::with<TrainingState>>;

// What spawn_training takes besides the config, as troupe::RunOptions does for troupe::train.
struct TrainingOptions {
  // A model given in code (troupe/stage.hpp: GPT blocks, custom stages or both, one entry per
  // virtual stage), checked against the job before anything runs; null: GPT's own model.
  std::shared_ptr<const Model> model;
  // A pipeline schedule given as data (troupe/schedule.hpp), checked as troupe::train checks it.
  std::shared_ptr<const sched::Schedule> schedule;
};

// Validates the config (as troupe::train does: the vocabulary from the tokenizer; the batches you
// send are the data, so the config names none), spawns the ranks in `system`, initialises the model
// from config.seed or loads config.load (any layout's checkpoint, optimizer state included), and
// returns the training actor. Blocks until the model is ready. Errors: bad input for a config,
// model, schedule or checkpoint that cannot work; nothing is left running. config.train_iters
// bounds nothing here (the caller decides how many batches it sends) but, with the learning-rate
// schedule's other settings, sets the decay length as in troupe train. With a model given in code
// the reported loss is the loss sum over Model::loss_terms_per_sample terms per window.
Result<training_actor> spawn_training(caf::actor_system& system, const TrainConfig& config,
                                      const TrainingOptions& options = {});

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, TokenBatch& x) {
  return f(caf::meta::type_name("TokenBatch"), x.sequences, x.tokens);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, TrainingState& x) {
  return f(caf::meta::type_name("TrainingState"), x.iteration, x.consumed_samples, x.next_lr, x.world_size,
           x.layout);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, TimerReading& x) {
  return f(caf::meta::type_name("TimerReading"), x.name, x.ms, x.min_ms, x.ranks_ms);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, MoeLayerLoad& x) {
  return f(caf::meta::type_name("MoeLayerLoad"), x.layer, x.micro_batches, x.routed, x.kept, x.dropped, x.lb_loss,
           x.z_loss);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, IterationStats& x) {
  return f(caf::meta::type_name("IterationStats"), x.iteration, x.train_iters, x.lm_loss, x.lr, x.grad_norm,
           x.ms_per_iter, x.tokens_per_sec, x.model_tflops, x.fraction_of_peak, x.consumed_samples,
           x.busy_fraction_min, x.busy_fraction_max, x.global_batch_size, x.loss_scale, x.skipped,
           x.nan_loss, x.timers, x.moe, x.moe_loss);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, EvalStats& x) {
  return f(caf::meta::type_name("EvalStats"), x.iteration, x.loss, x.perplexity, x.tokens);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SavedCheckpoint& x) {
  return f(caf::meta::type_name("SavedCheckpoint"), x.iteration, x.path, x.seconds, x.committed, x.memory);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, TrainSummary& x) {
  return f(caf::meta::type_name("TrainSummary"), x.iteration, x.last_loss, x.last_eval_loss, x.stopped_early,
           x.last_checkpoint);
}


}  // namespace troupe
