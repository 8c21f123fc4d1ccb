// The flags only pscore-train (the demo job's worker) takes: the training run's shape.
// Linked into pscore-train only; with the member and common flags they are all it takes.
#include <gflags/gflags.h>

#include "programs/common_flags.h"
#include "programs/flags.h"
#include "programs/member_flags.h"

DEFINE_int32(steps, 60, "pscore-train: synchronous SGD steps.");
DEFINE_int32(samples, 20000, "pscore-train: size of the synthetic data set (all workers).");
DEFINE_int32(dim, 64, "pscore-train: number of features.");
DEFINE_int32(keys, 8, "pscore-train: parameter keys the weights are split into.");
DEFINE_uint64(seed, 7, "pscore-train: seed of the synthetic data set.");
DEFINE_int32(scale_out_at, -1, "pscore-train: step at which rank 0 asks for one more server (-1: never).");
DEFINE_int32(scale_in_at, -1,
             "pscore-train: step at which rank 0 asks for one server fewer, the highest rank leaving (-1: never).");

namespace pscore::node {

CommandLine ParseTrainFlags(int* argc, char*** argv, const char* usage) {
  const std::string prog = flags::ParseCommandLine(argc, argv, usage);
  flags::ApplyLauncher(prog, flags::LauncherTargets{});  // a worker: no role, counts, job id or HTTP
  flags::CheckPort(prog, "scheduler_port", FLAGS_scheduler_port);
  flags::CheckHeartbeats(prog);
  flags::CheckTimeoutsAndRank(prog);
  flags::CheckMaxMessageBytes(prog);
  flags::CheckBufferPool(prog);
  flags::ApplyBufferPool();  // process-wide
  CommandLine cl;
  flags::LoadSecrets(prog, &cl);
  flags::FillSchedulerLink(&cl);
  flags::FillMemberOptions(prog, &cl);
  if (FLAGS_steps < 0 || FLAGS_samples < 1 || FLAGS_dim < 1 || FLAGS_keys < 1 || FLAGS_keys > FLAGS_dim) {
    flags::Die(prog, "--steps >= 0, --samples >= 1 and 1 <= --keys <= --dim are required");
  }
  cl.train.steps = FLAGS_steps;
  cl.train.samples = FLAGS_samples;
  cl.train.dim = FLAGS_dim;
  cl.train.keys = FLAGS_keys;
  cl.train.seed = FLAGS_seed;
  if (FLAGS_scale_out_at >= 0 && FLAGS_scale_out_at == FLAGS_scale_in_at) {
    flags::Die(prog, "--scale_out_at and --scale_in_at name the same step");
  }
  cl.train.scale_out_at = FLAGS_scale_out_at;
  cl.train.scale_in_at = FLAGS_scale_in_at;
  return cl;
}

}  // namespace pscore::node
