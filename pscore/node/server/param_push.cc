// ParamService, pushes: whole ones (HandlePush) forwarded to the backups (Replicate),
// large ones folded in as their values arrive (PushTail, CommitStreamedPush), and the
// push-id window that applies a push sent again at most once (ClaimPush;
// docs/reliability.md).
#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>

#include <glog/logging.h>

#include "pscore/core/kv_codec.h"
#include "pscore/node/common/wire.h"
#include "pscore/node/server/param_service.h"

namespace pscore::node {

using comm::Frame;

// ---- pushes folded in while their values arrive ----

// The tail of a large built-in push, taken from the connection's input buffer piece by
// piece (loop thread): each piece is folded into the store's spare blocks while it is
// still in cache, instead of the whole payload being written to memory and read back by
// the update. Nothing is visible before CommitStreamedPush; a connection lost mid-push
// drops the stream and with it every folded piece.
class ParamService::PushTail : public comm::TailStream {
 public:
  explicit PushTail(ParamService* service) : service_(service) {}

  bool Begin(Buffer& head, uint64_t tail) override {
    Result<core::KvView> view = core::DecodeKvPairsHead(head.data(), head.size(), tail);
    if (!view.ok()) return false;  // received whole: the handler refuses it as usual
    // Large keys only: a push small enough for the loop thread (SmallBuiltin) can then
    // never wait there for a stream, which only the loop thread itself could finish.
    for (size_t i = 0; i < view->num_keys; ++i) {
      if (uint64_t{view->Len(i)} * sizeof(float) < core::kZeroCopyBytes) return false;
    }
    auto lock = service_->ownership_->Share();
    if (!service_->ownership_->CheckOwned(view->keys, view->num_keys).ok()) return false;
    stream_ = service_->store_.BeginStream(view->keys, view->Lengths(), view->num_keys,
                                            core::ParamStore::Targets::kSparesOnly);
    if (stream_ != nullptr) keys_.assign(view->keys, view->keys + view->num_keys);
    return stream_ != nullptr;
  }
  void Consume(const char* data, size_t n) override {
    // Begin checked that the tail is sum(lens) whole floats; the decoder hands them over
    // 4-byte aligned.
    stream_->Apply(reinterpret_cast<const float*>(data), n / sizeof(float));
  }
  std::unique_ptr<core::ParamStore::PushStream>& stream() { return stream_; }
  const std::vector<uint64_t>& keys() const { return keys_; }

 private:
  ParamService* service_;
  std::unique_ptr<core::ParamStore::PushStream> stream_;
  std::vector<uint64_t> keys_;  // of the push, as verified by Begin
};

std::shared_ptr<comm::TailStream> ParamService::NewPushTail() {
  DCHECK(loop_->InLoopThread());
  return std::make_shared<PushTail>(this);
}

Status ParamService::CommitStreamedPush(Frame& frame) {
  DCHECK(loop_->InLoopThread());
  auto* tail = static_cast<PushTail*>(frame.stream.get());
  std::unique_ptr<core::ParamStore::PushStream> stream = std::move(tail->stream());
  const std::optional<core::PushId> id = PushIdOf(frame.meta);
  Status st;
  {
    // A scale-out or scale-in may have moved keys while the values arrived: then the
    // push is refused as one arriving now would be, and nothing is applied.
    auto lock = ownership_->Share();
    st = ownership_->CheckOwned(tail->keys().data(), tail->keys().size());
    // A push already applied is acknowledged, its folded values dropped uncommitted.
    std::optional<Status> answered;
    if (st.ok() && id) answered = ClaimPush(*id);
    if (answered) {
      st = *answered;
    } else if (st.ok()) {
      st = stream->Commit();
      if (id) dedup_.End(*id, st.ok());
    }
  }
  frame.stream.reset();
  stream.reset();  // an uncommitted stream lets go of its keys here
  if (st.ok()) streamed_pushes_.fetch_add(1, std::memory_order_relaxed);
  return st;
}

void ParamService::HandlePush(const DataRequest& req, Responder r, bool replica) {
  const char* data = req.payload ? req.payload->data() : "";
  size_t size = req.payload ? req.payload->size() : 0;
  Result<core::KvView> view = core::DecodeKvPairs(data, size, /*expect_values=*/true);
  if (!view.ok()) return r.Fail(view.status());
  // A key held by a push being folded in as it arrives (PushTail: keys of 64 KiB or more)
  // is waited for here, not under the ownership lock: the loop thread, which feeds that push,
  // takes the ownership lock.
  const core::RowLens lens = view->Lengths();
  auto is_large = [](uint32_t l) { return uint64_t{l} * sizeof(float) >= core::kZeroCopyBytes; };
  const bool large = lens.each() != nullptr ? std::any_of(lens.each(), lens.each() + view->num_keys, is_large)
                                            : view->num_keys > 0 && is_large(lens[0]);
  core::ParamStore::StreamHold hold =
      large ? store_.HoldStreamsOff(view->keys, lens, view->num_keys) : core::ParamStore::StreamHold();
  auto lock = ownership_->Share();
  // A worker's push is applied here and by each live backup of its keys' ranges, the
  // forwards sent before this server applies it (an answer only once all did:
  // docs/reliability.md); a forwarded one here only.
  std::vector<int> backups;
  if (Status owned = ownership_->CheckOwned(view->keys, view->num_keys, !replica, replica ? nullptr : &backups);
      !owned.ok()) {
    return r.Fail(owned);
  }
  if (replica) {
    // A range still being copied here (resync): held until its snapshot is installed.
    std::optional<Status> held = gate_ ? gate_->HoldForResync(req, r) : std::nullopt;
    if (held && !held->ok()) return r.Fail(*held);
    if (held) return;
  }
  std::function<void(const Status&)> replicated;  // reports this server's own apply
  auto forward = [&] {
    if (!backups.empty()) replicated = Replicate(req, std::move(backups), r);
  };
  auto done = [&](const Status& st) {
    if (replicated) return replicated(st);
    st.ok() ? r.Reply(nullptr) : r.Fail(st);
  };
  const std::string_view body(data, size);
  auto apply = [&] { return store_.Push(view->keys, lens, view->values, view->num_keys); };
  if (!req.push_id) {
    forward();
    return done(Journaled(core::JournalOp::kPush, body, apply));
  }
  const core::PushId& id = *req.push_id;
  // Applied before (a retried push, or one a former primary forwarded): not applied again,
  // but forwarded again, so a backup that missed it gets it (each backup's window applies
  // it at most once).
  std::optional<Status> answered = ClaimPush(id);
  if (answered) {
    if (answered->ok()) forward();
    return done(*answered);
  }
  forward();
  // Applied (a key of a wrong length is skipped, as replay skips it): the id is in the
  // window, entered with the store change under the journal's lock.
  bool ran = false;
  auto apply_and_end = [&] {
    ran = true;
    Status st = apply();
    dedup_.End(id, /*applied=*/true);
    return st;
  };
  Status st = journal_ ? JournaledRecord(core::JournalPushIdHead(id, body), body, apply_and_end) : apply_and_end();
  if (!ran) dedup_.End(id, /*applied=*/false);
  done(st);
}

std::function<void(const Status&)> ParamService::Replicate(const DataRequest& req, std::vector<int> backups,
                                                         Responder r) {
  // Every backup and this server's own apply report once; the first failure answers, and
  // the answer is ok only when all reported ok (a failed part never counts down).
  struct Round {
    std::atomic<size_t> left{0};
    std::atomic<bool> failed{false};
  };
  auto round = std::make_shared<Round>();
  round->left = backups.size() + 1;
  auto report = [r, round](const Status& st) {
    if (!st.ok()) {
      if (!round->failed.exchange(true)) r.Fail(st);
      return;
    }
    if (round->left.fetch_sub(1) == 1 && !round->failed.load()) r.Reply(nullptr);
  };
  bool queued = loop_->Run([this, req, backups = std::move(backups), report] {
    for (int backup : backups) {
      auto answered = [this, backup, report](const Status& st) {
        // The worker sends the push again (same id): this server acknowledges its repeat
        // and forwards it again, until the backup answers or the scheduler marks it down.
        if (!st.ok()) {
          return report(Status(Code::kUnavailable, "server " + options_.node_id + ": backup server rank " +
                                                       std::to_string(backup) + " did not apply the push: " +
                                                       st.message()));
        }
        report(st);
      };
      pb::MessageMeta meta;
      meta.set_cmd(pb::SEND_DATA);
      meta.set_handler(kReplicateHandler);
      if (req.push_id) {
        pb::PushId* id = meta.mutable_push_id();
        id->set_writer(req.push_id->writer);
        id->set_incarnation(req.push_id->incarnation);
        id->set_seq(req.push_id->seq);
        id->set_origin_seq(req.push_id->origin_seq);
      }
      links_->CallServer(backup, std::move(meta), req.payload,
                         [answered](Result<Frame> res) { answered(res.status()); });
    }
  });
  if (!queued) report(Status(Code::kCancelled, options_.node_id + " stopped"));
  return report;
}

std::optional<Status> ParamService::ClaimPush(const core::PushId& id) {
  if (id.seq == 0 || id.writer.empty() || id.writer.size() > core::PushDedup::kMaxWriterBytes) {
    return Status(Code::kInvalidArgument, "push id '" + id.writer.substr(0, 64) + "' seq " + std::to_string(id.seq) +
                                              ": a writer of 1 to 256 bytes and a seq >= 1 are required");
  }
  if (id.origin_seq >= id.seq) {
    return Status(Code::kInvalidArgument, "push " + core::ToString(id) + ": origin seq " +
                                              std::to_string(id.origin_seq) + " is not below the seq");
  }
  // Split from a part this server (or the one whose entries and window it received in a
  // scale) applied: its values are in the store already. Marked applied under its own id
  // too, so a part split from it later is recognised as well.
  const bool origin_applied =
      id.origin_seq != 0 && dedup_.Applied(core::PushId{id.writer, id.incarnation, id.origin_seq});
  switch (dedup_.Begin(id)) {
    case core::PushDedup::Verdict::kApply:
      if (!origin_applied) return std::nullopt;
      dedup_.End(id, /*applied=*/true);
      repeated_pushes_.fetch_add(1, std::memory_order_relaxed);
      VLOG(1) << "server " << options_.node_id << ": push " << core::ToString(id) << " is part of push seq "
              << id.origin_seq << ", applied before; acknowledged";
      return Status::Ok();
    case core::PushDedup::Verdict::kApplied:
      repeated_pushes_.fetch_add(1, std::memory_order_relaxed);
      VLOG(1) << "server " << options_.node_id << ": push " << core::ToString(id) << " applied before; acknowledged";
      return Status::Ok();
    case core::PushDedup::Verdict::kInFlight:
      return Status(Code::kUnavailable, "server " + options_.node_id + ": push " + core::ToString(id) +
                                            " is being applied by an earlier request; send it again");
    case core::PushDedup::Verdict::kTooOld:
      return Status(Code::kFailedPrecondition,
                    "server " + options_.node_id + ": push " + core::ToString(id) + " is older than the last " +
                        std::to_string(core::PushDedup::kWindow) + " applied pushes of its writer: not applied");
    case core::PushDedup::Verdict::kFull:
      break;
  }
  return Status(Code::kResourceExhausted, "server " + options_.node_id + ": push " + core::ToString(id) + ": " +
                                              std::to_string(core::PushDedup::kMaxWriters) +
                                              " writers tracked already: not applied");
}

}  // namespace pscore::node
