// The data-loader actor (data_loader_actor in actors/messages.hpp): assembles (count, S+1) token
// batches from a DataSource. Cheap work, so it runs on CAF's scheduler; reading ahead is the
// trainer's business (it asks for the next batch while the ranks compute).
#pragma once
#include <memory>

#include <caf/all.hpp>

#include "troupe/data_source.hpp"
#include "actors/messages.hpp"

namespace troupe {

data_loader_actor spawn_data_loader(caf::actor_system& system, std::shared_ptr<const DataSource> source);

}  // namespace troupe
