#include "actors/data_loader.hpp"

#include "actors/errors.hpp"

namespace troupe {

namespace {
data_loader_actor::behavior_type data_loader_behavior(data_loader_actor::pointer self,
                                                      std::shared_ptr<const DataSource> source) {
  name_exceptions(self, "the data loader");
  return {
      [source](batch_atom, DataSplit split, int64_t first, int32_t count) -> caf::result<Tensor> {
        const int64_t S = source->seq_length();
        Tensor batch = Tensor::empty({count, S + 1}, DType::i32);
        for (int32_t i = 0; i < count; ++i) {
          Status st = source->read(split, first + i, batch.data<int32_t>() + i * (S + 1));
          if (!st) return to_caf_error(st);
        }
        return batch;
      },
  };
}
}  // namespace

data_loader_actor spawn_data_loader(caf::actor_system& system, std::shared_ptr<const DataSource> source) {
  return system.spawn(data_loader_behavior, std::move(source));
}

}  // namespace troupe
