// Exit codes of pscore-node and pscore-train (docs/operations.md has the table), and how a
// member's end (Node::WaitForTermination) maps to one. Header only; any thread.
#pragma once

#include "pscore/core/status.h"

namespace pscore::node {

inline constexpr int kExitFinished = 0;        // the job finished (or an admin stopped it)
inline constexpr int kExitError = 1;           // a runtime failure: refused, port busy, signal
inline constexpr int kExitUsage = 2;           // bad flags
inline constexpr int kExitJobFailed = 3;       // the job failed: a member was lost and not replaced
inline constexpr int kExitSchedulerLost = 4;   // a member gave up on a silent or unreachable scheduler

// A member's end: kAborted is the scheduler saying the job failed (Node::Finish and
// WaitForTermination return it, message "job failed: ..."); kUnavailable is the scheduler
// lost (silent past the recovery timeout, or not reachable again within connect_timeout).
inline int MemberExitCode(const Status& end) {
  if (end.ok()) return kExitFinished;
  if (end.code() == Code::kAborted) return kExitJobFailed;
  if (end.code() == Code::kUnavailable) return kExitSchedulerLost;
  return kExitError;
}

}  // namespace pscore::node
