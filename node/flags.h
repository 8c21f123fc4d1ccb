// Command-line flags of pscore-node and pscore-admin (defined only in flags.cc).
// ParseFlags applies PSCORE_<FLAG> environment fallbacks, validates, and on a bad flag
// prints one line and exits with code 2.
#pragma once

#include <string>

#include "node/options.h"

namespace pscore::node {

struct TrainOptions {
  int steps = 60;
  int samples = 20000;
  int dim = 64;
  int keys = 8;
  uint64_t seed = 7;
  int scale_out_at = -1;
};

struct CommandLine {
  std::string role;
  SchedulerOptions scheduler;
  NodeOptions node;
  bool auto_finish = true;
  int64_t finish_timeout_ms = 0;
  std::string port_file;
  std::string update_rule;
  float learning_rate = 0.1f;
  TrainOptions train;
};

// Parses argv (removing flags) for the program `prog`; exits 2 on a bad flag.
CommandLine ParseFlags(int* argc, char*** argv, const char* usage);

}  // namespace pscore::node
