// ScaleParticipant: a member's side of scale-out and scale-in. It keeps the member's view
// of the cluster state and metadata epoch, judges every SCALE_OUT, SCALE_IN, metadata and
// heartbeat answer against them, and says what the member must do (tell its role, hold or
// release key-value traffic, move or hand over, send SCALE_*_DONE of an epoch, fetch the
// metadata). Pure bookkeeping, no I/O; owned by the Node and called on its loop thread only
// (not thread-safe). The scheduler's side is ClusterManager (cluster_manager_scale.cc).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pscore/proto/comm.pb.h"

namespace pscore::core {

// One thing the member must do; an event's actions are done in their order.
struct ScaleAction {
  enum class Kind {
    kIgnoreStale,       // drop the message or report: `reason` says why
    kStateChanged,      // the cluster state is `state` now: publish it and tell the role
    kMoveForScaleOut,   // the metadata of `epoch` holds every new node: the role moves its part
    kHandOver,          // the scale-in of `epoch` started: the role hands over
    kSendScaleOutDone,  // send SCALE_OUT_DONE of `epoch`
    kSendScaleInDone,   // send SCALE_IN_DONE of `epoch`
    kFetchMetadata,     // the scheduler is at `epoch`, past ours: fetch the metadata
  };
  Kind kind = Kind::kIgnoreStale;
  uint64_t epoch = 0;
  pb::ClusterState state = pb::ClUSTER_STARTING;
  // kStateChanged: the scale ended, so key-value traffic held for it goes out now (after
  // the role heard of the new state).
  bool release_hold = false;
  std::string reason;  // kIgnoreStale
};
using ScaleActions = std::vector<ScaleAction>;
// The event was stale: its only action is kIgnoreStale.
bool Ignored(const ScaleActions& actions);

class ScaleParticipant {
 public:
  enum class Phase {
    kSteady,              // the cluster does not scale
    kScaleOutWaiting,     // SCALE_OUT: no metadata holding every new node yet
    kScaleOutMoving,      // the role moves its part for the metadata of moving_epoch()
    kScaleOutDone,        // SCALE_OUT_DONE sent for that epoch
    kScaleInWaiting,      // SCALE_IN, its SCALE_IN notice not here yet
    kScaleInHandingOver,  // the role hands over for scale_in_epoch()
    kScaleInDone,         // handed over, SCALE_IN_DONE sent; a republish sends it again
  };

  // ---- events: each returns what the member must do, in order ----
  // A SCALE_OUT notice of `epoch`: stale when older than the metadata applied.
  ScaleActions OnScaleOut(uint64_t epoch);
  // A SCALE_IN notice of `epoch`: stale when older than the metadata applied, or not newer
  // than the scale-in under way. Otherwise the role hands over.
  ScaleActions OnScaleIn(uint64_t epoch);
  // The role handed over for the scale-in of `epoch`: SCALE_IN_DONE of the newest epoch
  // known, unless that scale-in is no longer the one under way.
  ScaleActions OnHandedOver(uint64_t epoch);
  // Metadata of `epoch` arrived: stale when older than the one applied. Otherwise its epoch
  // is taken (an empty answer) and the member applies it, its state through OnState, then
  // calls OnMetadataApplied.
  ScaleActions OnMetadata(uint64_t epoch);
  // The metadata taken by OnMetadata and its state are applied; `holds_every_node`: its
  // members match the totals. During a scale-out, the first such metadata of an epoch
  // starts the role's move (once per epoch); during a scale-in handed over already, a
  // newer epoch (a republish) restarts the done round there.
  ScaleActions OnMetadataApplied(bool holds_every_node);
  // The role moved its part for the metadata of `epoch`: SCALE_OUT_DONE of it, once, if
  // no newer metadata came meanwhile.
  ScaleActions OnMovedForScaleOut(uint64_t epoch);
  // The scheduler says the cluster is in `state` (an event, a heartbeat, a registration).
  ScaleActions OnState(pb::ClusterState state);
  // A heartbeat (or registration) answer: a newer epoch than ours means a membership
  // change we missed, fetched before its state is acted on; else the state is taken.
  ScaleActions OnSchedulerAnswer(uint64_t epoch, pb::ClusterState state);
  // A metadata fetch returned, the epoch before it applied `before`: the epoch to fetch
  // next (a heartbeat showed a newer one meanwhile and the answer moved us forward), or 0.
  uint64_t FetchAgain(uint64_t before) const;
  // A fetch of `epoch` is asked for (remembered as the newest epoch wanted).
  void WantMetadata(uint64_t epoch);

  // ---- the member's view ----
  pb::ClusterState state() const { return state_; }
  uint64_t epoch() const { return epoch_; }
  Phase phase() const { return phase_; }
  // Key-value traffic waits while the cluster scales.
  bool holding() const { return phase_ != Phase::kSteady; }
  // A role's key view may settle: the cluster has started and does not scale.
  bool settled() const { return phase_ == Phase::kSteady && state_ != pb::ClUSTER_STARTING; }
  uint64_t scale_in_epoch() const { return scale_in_epoch_; }  // 0: no scale-in under way
  uint64_t moving_epoch() const { return moving_epoch_; }      // newest epoch moved for
  uint64_t metadata_wanted() const { return metadata_wanted_; }

 private:
  static bool ScaleOutPhase(Phase p);
  static bool ScaleInPhase(Phase p);
  static ScaleAction Stale(std::string reason);

  pb::ClusterState state_ = pb::ClUSTER_STARTING;
  Phase phase_ = Phase::kSteady;
  uint64_t epoch_ = 0;            // of the metadata applied last
  uint64_t metadata_wanted_ = 0;  // newest epoch a scheduler answer showed
  uint64_t moving_epoch_ = 0;     // newest metadata epoch whose scale-out move started
  uint64_t out_done_epoch_ = 0;   // newest epoch SCALE_OUT_DONE was sent for
  uint64_t scale_in_epoch_ = 0;   // the scale-in under way (0: none)
};

const char* ScalePhaseName(ScaleParticipant::Phase phase);

}  // namespace pscore::core
