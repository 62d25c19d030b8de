// troupe's public API in one include: training and evaluation from code (train.hpp), Megatron flags
// (flags.hpp), the configuration (train_config.hpp, model_config.hpp), data sources
// (data_source.hpp), schedules as data (schedule.hpp), custom stages (stage.hpp), what a run reports (reports.hpp) and errors
// as values (status.hpp). docs/EMBEDDING.md is the tour.
#pragma once
#include "troupe/data_source.hpp"
#include "troupe/flags.hpp"
#include "troupe/model_config.hpp"
#include "troupe/reports.hpp"
#include "troupe/schedule.hpp"
#include "troupe/stage.hpp"
#include "troupe/status.hpp"
#include "troupe/train.hpp"
#include "troupe/train_config.hpp"
#include "troupe/version.hpp"
