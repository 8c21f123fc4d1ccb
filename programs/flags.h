// The command lines of pscore-node, pscore-admin and pscore-train. Each program links
// only its own flags (<program>_flags.cc, plus member_flags.cc for the node and the trainer
// and common_flags.cc for all three), so its --help lists them and any other flag is
// refused as unknown. Each Parse*Flags applies PSCORE_<FLAG> environment fallbacks,
// validates, and on a bad flag prints one line and exits with code 2.
#pragma once

#include <string>
#include <vector>

#include "pscore/node/common/options.h"

namespace pscore::node {

struct TrainOptions {
  int steps = 60;
  int samples = 20000;
  int dim = 64;
  int keys = 8;
  uint64_t seed = 7;
  int scale_out_at = -1;
  int scale_in_at = -1;
};

// pscore-admin only.
struct AdminFlags {
  int workers = -1;  // -1: not given
  int servers = -1;
  std::vector<std::string> node_ids;
  bool json = false;
  int64_t timeout_ms = 10000;
  bool wait = true;
  int64_t wait_timeout_ms = 120000;
  int64_t reconnect_ms = 0;  // watch-ranktable: how long to keep subscribing again
  bool publisher = false;    // watch-ranktable: register as the job's publisher first
};

struct CommandLine {
  std::string role;
  std::string cluster_token;  // from --cluster_token_file; empty: none
  SchedulerOptions scheduler;
  NodeOptions node;
  bool auto_finish = true;
  int64_t finish_timeout_ms = 0;
  std::string port_file;
  std::string http_port_file;  // scheduler: where to write the bound HTTP port
  std::string update_rule;
  float learning_rate = 0.1f;
  uint64_t stream_spare_bytes = 512ull << 20;  // server: ParamStore::Options::stream_spare_bytes
  unsigned store_threads = 0;                  // server: ParamStore::Options::batch_threads
  TrainOptions train;
  AdminFlags admin;
};

// Each parses argv (removing flags) for its program, as main() starts; the fields of
// CommandLine the program has no flag for keep their defaults.
CommandLine ParseNodeFlags(int* argc, char*** argv, const char* usage);   // node_flags.cc
CommandLine ParseTrainFlags(int* argc, char*** argv, const char* usage);  // train_flags.cc
CommandLine ParseAdminFlags(int* argc, char*** argv, const char* usage);  // admin_flags.cc

}  // namespace pscore::node
