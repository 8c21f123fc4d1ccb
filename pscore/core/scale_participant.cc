// ScaleParticipant: the member's side of scaling (see the header). Epochs only grow, so
// every rule below is a comparison with the newest epoch seen of its kind.
#include "pscore/core/scale_participant.h"

#include <algorithm>

namespace pscore::core {
namespace {

ScaleAction Act(ScaleAction::Kind kind, uint64_t epoch) {
  ScaleAction a;
  a.kind = kind;
  a.epoch = epoch;
  return a;
}

}  // namespace

bool Ignored(const ScaleActions& actions) {
  return !actions.empty() && actions.front().kind == ScaleAction::Kind::kIgnoreStale;
}

const char* ScalePhaseName(ScaleParticipant::Phase phase) {
  using Phase = ScaleParticipant::Phase;
  switch (phase) {
    case Phase::kSteady: return "steady";
    case Phase::kScaleOutWaiting: return "scale-out waiting for new nodes";
    case Phase::kScaleOutMoving: return "scale-out moving";
    case Phase::kScaleOutDone: return "scale-out done";
    case Phase::kScaleInWaiting: return "scale-in waiting for its notice";
    case Phase::kScaleInHandingOver: return "scale-in handing over";
    case Phase::kScaleInDone: return "scale-in done";
  }
  return "?";
}

bool ScaleParticipant::ScaleOutPhase(Phase p) {
  return p == Phase::kScaleOutWaiting || p == Phase::kScaleOutMoving || p == Phase::kScaleOutDone;
}

bool ScaleParticipant::ScaleInPhase(Phase p) {
  return p == Phase::kScaleInWaiting || p == Phase::kScaleInHandingOver || p == Phase::kScaleInDone;
}

ScaleAction ScaleParticipant::Stale(std::string reason) {
  ScaleAction a;
  a.reason = std::move(reason);
  return a;
}

ScaleActions ScaleParticipant::OnScaleOut(uint64_t epoch) {
  if (epoch < epoch_) {
    return {Stale("stale SCALE_OUT of epoch " + std::to_string(epoch) + " < " + std::to_string(epoch_))};
  }
  return OnState(pb::CLUSTER_SCALE_OUT);
}

ScaleActions ScaleParticipant::OnScaleIn(uint64_t epoch) {
  if (epoch < epoch_ || epoch <= scale_in_epoch_) {
    return {Stale("stale SCALE_IN of epoch " + std::to_string(epoch) + " (metadata epoch " + std::to_string(epoch_) +
                  ", scale-in under way " + std::to_string(scale_in_epoch_) + ")")};
  }
  scale_in_epoch_ = epoch;
  phase_ = Phase::kScaleInHandingOver;
  ScaleActions actions = OnState(pb::CLUSTER_SCALE_IN);
  actions.push_back(Act(ScaleAction::Kind::kHandOver, epoch));
  return actions;
}

// The done round is that of the newest epoch: a republish that came while the role was
// handing over is answered here.
ScaleActions ScaleParticipant::OnHandedOver(uint64_t epoch) {
  if (epoch != scale_in_epoch_) {
    return {Stale("hand-over for the scale-in of epoch " + std::to_string(epoch) +
                  " ended after it (scale-in under way: " + std::to_string(scale_in_epoch_) + ")")};
  }
  phase_ = Phase::kScaleInDone;
  return {Act(ScaleAction::Kind::kSendScaleInDone, std::max(epoch_, epoch))};
}

ScaleActions ScaleParticipant::OnMetadata(uint64_t epoch) {
  if (epoch < epoch_) {
    return {Stale("stale metadata of epoch " + std::to_string(epoch) + " < " + std::to_string(epoch_))};
  }
  epoch_ = epoch;
  return {};
}

ScaleActions ScaleParticipant::OnMetadataApplied(bool holds_every_node) {
  ScaleActions actions;
  if (state_ == pb::CLUSTER_SCALE_OUT && epoch_ > moving_epoch_ && holds_every_node) {
    moving_epoch_ = epoch_;
    phase_ = Phase::kScaleOutMoving;
    actions.push_back(Act(ScaleAction::Kind::kMoveForScaleOut, epoch_));
  }
  // A republish during scale-in restarts the done round at the new epoch.
  if (state_ == pb::CLUSTER_SCALE_IN && phase_ == Phase::kScaleInDone && epoch_ > scale_in_epoch_) {
    actions.push_back(Act(ScaleAction::Kind::kSendScaleInDone, epoch_));
  }
  return actions;
}

ScaleActions ScaleParticipant::OnMovedForScaleOut(uint64_t epoch) {
  if (epoch != epoch_) {
    return {Stale("scale-out move for the metadata of epoch " + std::to_string(epoch) + " ended under epoch " +
                  std::to_string(epoch_))};
  }
  if (epoch <= out_done_epoch_) {
    return {Stale("SCALE_OUT_DONE of epoch " + std::to_string(epoch) + " was sent already")};
  }
  out_done_epoch_ = epoch;
  if (phase_ == Phase::kScaleOutMoving && moving_epoch_ == epoch) phase_ = Phase::kScaleOutDone;
  return {Act(ScaleAction::Kind::kSendScaleOutDone, epoch)};
}

ScaleActions ScaleParticipant::OnState(pb::ClusterState state) {
  if (state == state_) return {};
  const bool was_holding = holding();
  state_ = state;
  if (state != pb::CLUSTER_SCALE_IN) scale_in_epoch_ = 0;
  if (state == pb::CLUSTER_SCALE_OUT) {
    if (!ScaleOutPhase(phase_)) phase_ = Phase::kScaleOutWaiting;
  } else if (state == pb::CLUSTER_SCALE_IN) {
    if (!ScaleInPhase(phase_)) phase_ = Phase::kScaleInWaiting;
  } else {
    phase_ = Phase::kSteady;
  }
  ScaleAction changed = Act(ScaleAction::Kind::kStateChanged, epoch_);
  changed.state = state;
  changed.release_hold = was_holding && !holding();
  return {changed};
}

ScaleActions ScaleParticipant::OnSchedulerAnswer(uint64_t epoch, pb::ClusterState state) {
  if (epoch > epoch_ && state != pb::ClUSTER_STARTING) {
    // A membership change we missed: its state comes with its metadata, so nothing acts
    // on a state whose membership the member does not have yet.
    return {Act(ScaleAction::Kind::kFetchMetadata, epoch)};
  }
  return OnState(state);
}

uint64_t ScaleParticipant::FetchAgain(uint64_t before) const {
  return epoch_ > before && epoch_ < metadata_wanted_ ? metadata_wanted_ : 0;
}

void ScaleParticipant::WantMetadata(uint64_t epoch) { metadata_wanted_ = std::max(metadata_wanted_, epoch); }

}  // namespace pscore::core
