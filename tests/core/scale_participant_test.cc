// A member's side of scaling (pscore/core/scale_participant.h) alone: every transition,
// stale notices and reports ignored, the scale-in done round restarted by a republish,
// SCALE_OUT_DONE once per epoch, the hold while the cluster scales.
#include <vector>

#include "pscore/core/scale_participant.h"

#include <catch2/catch.hpp>  // last: its CHECK must win over glog's

namespace pscore::core {
namespace {

using Kind = ScaleAction::Kind;
using Phase = ScaleParticipant::Phase;

std::vector<Kind> Kinds(const ScaleActions& actions) {
  std::vector<Kind> kinds;
  for (const ScaleAction& a : actions) kinds.push_back(a.kind);
  return kinds;
}

// A member that took the metadata of `epoch` in `state`, as Node::ApplyMetadata does.
ScaleActions ApplyMetadata(ScaleParticipant* p, uint64_t epoch, pb::ClusterState state, bool holds_every_node) {
  ScaleActions taken = p->OnMetadata(epoch);
  if (Ignored(taken)) return taken;
  ScaleActions state_actions = p->OnState(state);
  ScaleActions after = p->OnMetadataApplied(holds_every_node);
  state_actions.insert(state_actions.end(), after.begin(), after.end());
  return state_actions;
}

// READY under the metadata of `epoch`.
ScaleParticipant ReadyAt(uint64_t epoch) {
  ScaleParticipant p;
  ApplyMetadata(&p, epoch, pb::CLUSTER_READY, true);
  REQUIRE(p.state() == pb::CLUSTER_READY);
  REQUIRE(p.phase() == Phase::kSteady);
  return p;
}

TEST_CASE("scale participant: starts steady and settles once the cluster has started", "[core][scale]") {
  ScaleParticipant p;
  CHECK(p.phase() == Phase::kSteady);
  CHECK_FALSE(p.holding());
  CHECK_FALSE(p.settled());  // CLUSTER_STARTING
  const ScaleActions a = ApplyMetadata(&p, 1, pb::CLUSTER_READY, true);
  REQUIRE(Kinds(a) == std::vector<Kind>{Kind::kStateChanged});
  CHECK(a[0].state == pb::CLUSTER_READY);
  CHECK_FALSE(a[0].release_hold);
  CHECK(p.settled());
  CHECK(p.epoch() == 1);
  CHECK(p.OnState(pb::CLUSTER_READY).empty());  // no change, nothing to do
}

TEST_CASE("scale participant: scale-out holds, moves once the metadata is complete, sends done once per epoch",
          "[core][scale]") {
  ScaleParticipant p = ReadyAt(3);

  ScaleActions a = p.OnScaleOut(4);
  REQUIRE(Kinds(a) == std::vector<Kind>{Kind::kStateChanged});
  CHECK(a[0].state == pb::CLUSTER_SCALE_OUT);
  CHECK(p.phase() == Phase::kScaleOutWaiting);
  CHECK(p.holding());
  CHECK_FALSE(p.settled());

  // The new totals without the new nodes: nothing moves yet.
  CHECK(ApplyMetadata(&p, 4, pb::CLUSTER_SCALE_OUT, false).empty());
  CHECK(p.phase() == Phase::kScaleOutWaiting);

  // Every new node in: the role moves for epoch 5, once.
  a = ApplyMetadata(&p, 5, pb::CLUSTER_SCALE_OUT, true);
  REQUIRE(Kinds(a) == std::vector<Kind>{Kind::kMoveForScaleOut});
  CHECK(a[0].epoch == 5);
  CHECK(p.phase() == Phase::kScaleOutMoving);
  CHECK(p.moving_epoch() == 5);
  CHECK(ApplyMetadata(&p, 5, pb::CLUSTER_SCALE_OUT, true).empty());  // the same epoch again

  a = p.OnMovedForScaleOut(5);
  REQUIRE(Kinds(a) == std::vector<Kind>{Kind::kSendScaleOutDone});
  CHECK(a[0].epoch == 5);
  CHECK(p.phase() == Phase::kScaleOutDone);
  CHECK(p.holding());

  // A second report of the same move sends nothing.
  a = p.OnMovedForScaleOut(5);
  REQUIRE(Kinds(a) == std::vector<Kind>{Kind::kIgnoreStale});
  CHECK_THAT(a[0].reason, Catch::Contains("sent already"));

  // READY: the hold ends and held traffic goes out.
  a = p.OnState(pb::CLUSTER_READY);
  REQUIRE(Kinds(a) == std::vector<Kind>{Kind::kStateChanged});
  CHECK(a[0].release_hold);
  CHECK(p.phase() == Phase::kSteady);
  CHECK_FALSE(p.holding());
  CHECK(p.settled());
}

TEST_CASE("scale participant: a republish during scale-out moves again and only the newest epoch is done",
          "[core][scale]") {
  ScaleParticipant p = ReadyAt(3);
  p.OnScaleOut(4);
  REQUIRE(Kinds(ApplyMetadata(&p, 5, pb::CLUSTER_SCALE_OUT, true)) == std::vector<Kind>{Kind::kMoveForScaleOut});
  ScaleActions a = ApplyMetadata(&p, 6, pb::CLUSTER_SCALE_OUT, true);
  REQUIRE(Kinds(a) == std::vector<Kind>{Kind::kMoveForScaleOut});
  CHECK(a[0].epoch == 6);

  // The move for epoch 5 ends under epoch 6: no SCALE_OUT_DONE for it.
  a = p.OnMovedForScaleOut(5);
  REQUIRE(Kinds(a) == std::vector<Kind>{Kind::kIgnoreStale});
  CHECK_THAT(a[0].reason, Catch::Contains("epoch 5"));
  CHECK(p.phase() == Phase::kScaleOutMoving);

  a = p.OnMovedForScaleOut(6);
  REQUIRE(Kinds(a) == std::vector<Kind>{Kind::kSendScaleOutDone});
  CHECK(a[0].epoch == 6);
}

TEST_CASE("scale participant: a rolled-back scale-out releases the hold and forgets the move", "[core][scale]") {
  ScaleParticipant p = ReadyAt(3);
  p.OnScaleOut(4);
  ApplyMetadata(&p, 5, pb::CLUSTER_SCALE_OUT, true);
  // Rollback: READY under a new epoch.
  ScaleActions a = ApplyMetadata(&p, 6, pb::CLUSTER_READY, true);
  REQUIRE(Kinds(a) == std::vector<Kind>{Kind::kStateChanged});
  CHECK(a[0].release_hold);
  CHECK(p.phase() == Phase::kSteady);
  // The move ends late: the metadata moved on, nothing is sent.
  CHECK(Kinds(p.OnMovedForScaleOut(5)) == std::vector<Kind>{Kind::kIgnoreStale});
}

TEST_CASE("scale participant: stale SCALE_OUT, SCALE_IN and metadata are ignored with a reason", "[core][scale]") {
  ScaleParticipant p = ReadyAt(7);

  ScaleActions a = p.OnScaleOut(6);
  REQUIRE(Kinds(a) == std::vector<Kind>{Kind::kIgnoreStale});
  CHECK_THAT(a[0].reason, Catch::Contains("SCALE_OUT of epoch 6"));
  CHECK(p.state() == pb::CLUSTER_READY);

  a = p.OnScaleIn(6);
  REQUIRE(Kinds(a) == std::vector<Kind>{Kind::kIgnoreStale});
  CHECK_THAT(a[0].reason, Catch::Contains("SCALE_IN of epoch 6"));
  CHECK(p.scale_in_epoch() == 0);

  a = p.OnMetadata(6);
  REQUIRE(Kinds(a) == std::vector<Kind>{Kind::kIgnoreStale});
  CHECK_THAT(a[0].reason, Catch::Contains("metadata of epoch 6 < 7"));
  CHECK(p.epoch() == 7);

  // The notice of the epoch the member is at is not stale (the metadata may come first).
  CHECK_FALSE(Ignored(p.OnScaleOut(7)));
  CHECK(p.state() == pb::CLUSTER_SCALE_OUT);
}

TEST_CASE("scale participant: a scale-in notice is taken once - a repeat of its epoch or an older one is stale",
          "[core][scale]") {
  ScaleParticipant p = ReadyAt(3);
  ScaleActions a = p.OnScaleIn(4);
  REQUIRE(Kinds(a) == std::vector<Kind>{Kind::kStateChanged, Kind::kHandOver});
  CHECK(a[0].state == pb::CLUSTER_SCALE_IN);
  CHECK(a[1].epoch == 4);
  CHECK(p.phase() == Phase::kScaleInHandingOver);
  CHECK(p.scale_in_epoch() == 4);
  CHECK(p.holding());

  a = p.OnScaleIn(4);
  REQUIRE(Kinds(a) == std::vector<Kind>{Kind::kIgnoreStale});
  CHECK_THAT(a[0].reason, Catch::Contains("scale-in under way 4"));
  CHECK(p.phase() == Phase::kScaleInHandingOver);
}

TEST_CASE("scale participant: scale-in hands over, sends done, and a republish restarts the done round",
          "[core][scale]") {
  ScaleParticipant p = ReadyAt(3);
  p.OnScaleIn(4);
  // The metadata of the scale-in itself: nothing more to do while handing over.
  CHECK(ApplyMetadata(&p, 4, pb::CLUSTER_SCALE_IN, true).empty());

  ScaleActions a = p.OnHandedOver(4);
  REQUIRE(Kinds(a) == std::vector<Kind>{Kind::kSendScaleInDone});
  CHECK(a[0].epoch == 4);
  CHECK(p.phase() == Phase::kScaleInDone);

  // The scheduler republished (a node's metadata changed): done again at the new epoch.
  a = ApplyMetadata(&p, 5, pb::CLUSTER_SCALE_IN, true);
  REQUIRE(Kinds(a) == std::vector<Kind>{Kind::kSendScaleInDone});
  CHECK(a[0].epoch == 5);
  a = ApplyMetadata(&p, 6, pb::CLUSTER_SCALE_IN, true);
  REQUIRE(Kinds(a) == std::vector<Kind>{Kind::kSendScaleInDone});
  CHECK(a[0].epoch == 6);

  // Scale-in complete: READY under the dense ranks, the hold ends.
  a = ApplyMetadata(&p, 7, pb::CLUSTER_READY, true);
  REQUIRE(Kinds(a) == std::vector<Kind>{Kind::kStateChanged});
  CHECK(a[0].release_hold);
  CHECK(p.phase() == Phase::kSteady);
  CHECK(p.scale_in_epoch() == 0);
}

TEST_CASE("scale participant: a republish while handing over is answered at its epoch when the hand-over ends",
          "[core][scale]") {
  ScaleParticipant p = ReadyAt(3);
  p.OnScaleIn(4);
  // Not handed over yet: the republish sends nothing.
  CHECK(ApplyMetadata(&p, 5, pb::CLUSTER_SCALE_IN, true).empty());
  const ScaleActions a = p.OnHandedOver(4);
  REQUIRE(Kinds(a) == std::vector<Kind>{Kind::kSendScaleInDone});
  CHECK(a[0].epoch == 5);
}

TEST_CASE("scale participant: a hand-over that ends after its scale-in is ignored", "[core][scale]") {
  ScaleParticipant p = ReadyAt(3);
  p.OnScaleIn(4);
  // Rolled back before the role finished.
  ApplyMetadata(&p, 5, pb::CLUSTER_READY, true);
  CHECK(p.scale_in_epoch() == 0);
  ScaleActions a = p.OnHandedOver(4);
  REQUIRE(Kinds(a) == std::vector<Kind>{Kind::kIgnoreStale});
  CHECK_THAT(a[0].reason, Catch::Contains("scale-in of epoch 4"));
  CHECK(p.phase() == Phase::kSteady);

  // A later scale-in: its hand-over is its own; the earlier one's report still counts for nothing.
  p.OnScaleIn(6);
  CHECK(Kinds(p.OnHandedOver(4)) == std::vector<Kind>{Kind::kIgnoreStale});
  CHECK(Kinds(p.OnHandedOver(6)) == std::vector<Kind>{Kind::kSendScaleInDone});
}

TEST_CASE("scale participant: a finished scale-in does not answer the next one's metadata before its notice",
          "[core][scale]") {
  ScaleParticipant p = ReadyAt(3);
  p.OnScaleIn(4);
  p.OnHandedOver(4);
  ApplyMetadata(&p, 5, pb::CLUSTER_READY, true);
  // The next scale-in's metadata arrives before its SCALE_IN notice: nothing handed over
  // for it, so no SCALE_IN_DONE.
  CHECK(Kinds(ApplyMetadata(&p, 6, pb::CLUSTER_SCALE_IN, true)) == std::vector<Kind>{Kind::kStateChanged});
  CHECK(p.phase() == Phase::kScaleInWaiting);
  CHECK(p.holding());
  ScaleActions a = p.OnScaleIn(6);
  REQUIRE(Kinds(a) == std::vector<Kind>{Kind::kHandOver});  // the state is SCALE_IN already
  CHECK(p.phase() == Phase::kScaleInHandingOver);
}

TEST_CASE("scale participant: a heartbeat showing a newer epoch fetches the metadata before taking its state",
          "[core][scale]") {
  ScaleParticipant p = ReadyAt(3);
  ScaleActions a = p.OnSchedulerAnswer(5, pb::CLUSTER_SCALE_IN);
  REQUIRE(Kinds(a) == std::vector<Kind>{Kind::kFetchMetadata});
  CHECK(a[0].epoch == 5);
  CHECK(p.state() == pb::CLUSTER_READY);

  // A starting cluster's answer is taken as it is.
  ScaleParticipant fresh;
  a = fresh.OnSchedulerAnswer(2, pb::ClUSTER_STARTING);
  CHECK(a.empty());

  // The same epoch: the state is taken.
  a = p.OnSchedulerAnswer(3, pb::NODE_TIMEOUT);
  REQUIRE(Kinds(a) == std::vector<Kind>{Kind::kStateChanged});
  CHECK(a[0].state == pb::NODE_TIMEOUT);
  CHECK_FALSE(a[0].release_hold);
}

TEST_CASE("scale participant: a fetch answer older than the newest epoch wanted fetches again while it moves forward",
          "[core][scale]") {
  ScaleParticipant p = ReadyAt(3);
  p.WantMetadata(5);
  p.WantMetadata(8);
  p.WantMetadata(6);  // the newest stays
  CHECK(p.metadata_wanted() == 8);
  ApplyMetadata(&p, 6, pb::CLUSTER_READY, true);
  CHECK(p.FetchAgain(/*before=*/3) == 8);
  // An answer that did not move the epoch (stale or the same) is not fetched again: the
  // next heartbeat asks.
  CHECK(p.FetchAgain(/*before=*/6) == 0);
  ApplyMetadata(&p, 8, pb::CLUSTER_READY, true);
  CHECK(p.FetchAgain(/*before=*/6) == 0);
}

TEST_CASE("scale participant: leaving a scale for any state ends the hold, other state changes keep it",
          "[core][scale]") {
  ScaleParticipant p = ReadyAt(3);
  CHECK_FALSE(p.OnState(pb::NODE_TIMEOUT)[0].release_hold);  // not holding: nothing to release
  p.OnScaleOut(4);
  CHECK(p.holding());
  ScaleActions a = p.OnState(pb::CLUSTER_EXIT);
  REQUIRE(Kinds(a) == std::vector<Kind>{Kind::kStateChanged});
  CHECK(a[0].release_hold);
  CHECK_FALSE(p.holding());
  CHECK(ScalePhaseName(p.phase()) == std::string("steady"));
}

}  // namespace
}  // namespace pscore::core
