// Command-line flags of pscore-node, pscore-admin and pscore-train (defined only in
// flags.cc; each program takes its own subset, see Program).
// ParseFlags applies PSCORE_<FLAG> environment fallbacks, validates, and on a bad flag
// prints one line and exits with code 2.
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
  TrainOptions train;
  AdminFlags admin;
};

// The program whose flags are parsed: each takes (and --help lists) only its own flags.
enum class Program { kNode, kAdmin, kTrain };

// Parses argv (removing flags) for `program`; exits 2 on a bad flag or one the program does
// not take.
CommandLine ParseFlags(int* argc, char*** argv, const char* usage, Program program);

}  // namespace pscore::node
