// ServerNode, the built-in store's pushes: whole ones (HandlePush), large ones folded in
// as their values arrive (PushTail, CommitStreamedPush), and the push-id window that
// applies a push sent again at most once (ClaimPush; docs/reliability.md).
#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>

#include "pscore/core/kv_codec.h"
#include "pscore/node/server/server_node.h"
#include "pscore/node/common/wire.h"

namespace pscore::node {

using comm::ConnId;
using comm::Frame;

// ---- pushes folded in while their values arrive ----

// The tail of a large built-in push, taken from the connection's input buffer piece by
// piece (loop thread): each piece is folded into the store's spare blocks while it is
// still in cache, instead of the whole payload being written to memory and read back by
// the update. Nothing is visible before CommitStreamedPush; a connection lost mid-push
// drops the stream and with it every folded piece.
class ServerNode::PushTail : public comm::TailStream {
 public:
  explicit PushTail(ServerNode* server) : server_(server) {}

  bool Begin(Buffer& head, uint64_t tail) override {
    Result<core::KvView> view = core::DecodeKvPairsHead(head.data(), head.size(), tail);
    if (!view.ok()) return false;  // received whole: the handler refuses it as usual
    // Large keys only: a push small enough for the loop thread (SmallBuiltin) can then
    // never wait there for a stream, which only the loop thread itself could finish.
    for (size_t i = 0; i < view->num_keys; ++i) {
      if (uint64_t{view->lens[i]} * sizeof(float) < core::kZeroCopyBytes) return false;
    }
    std::shared_lock<std::shared_mutex> lock(server_->view_mu_);
    if (!server_->CheckOwned(view->keys, view->num_keys).ok()) return false;
    stream_ = server_->store_.BeginStream(view->keys, view->lens, view->num_keys,
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
  ServerNode* server_;
  std::unique_ptr<core::ParamStore::PushStream> stream_;
  std::vector<uint64_t> keys_;  // of the push, as verified by Begin
};

std::shared_ptr<comm::TailStream> ServerNode::OnRequestStream(ConnId conn, const pb::MessageMeta& meta,
                                                              uint64_t tail) {
  // Large pushes of the built-in store only, from a member, served in order: no earlier
  // request of the link still with the handler threads, no journal (it logs whole pushes).
  if (meta.cmd() != pb::SEND_DATA || meta.handler() != kPushHandler || tail < core::kZeroCopyBytes) return nullptr;
  // Handlers on the loop thread (no executor) would wait there for the stream: none then.
  if (!executor_ || journal_ || !members_.count(conn) || held_.count(conn) ||
      cluster_state() == pb::CLUSTER_DISABLE_FLS) {
    return nullptr;
  }
  {
    // A replicated push is forwarded whole to the backups: received whole.
    std::shared_lock<std::shared_mutex> lock(view_mu_);
    if (view_replicas_ > 1) return nullptr;
  }
  auto pending = in_executor_.find(conn);
  if (pending != in_executor_.end() && pending->second->load(std::memory_order_acquire) != 0) return nullptr;
  return std::make_shared<PushTail>(this);
}

void ServerNode::CommitStreamedPush(ConnId conn, Frame&& frame) {
  auto* tail = static_cast<PushTail*>(frame.stream.get());
  std::unique_ptr<core::ParamStore::PushStream> stream = std::move(tail->stream());
  std::optional<core::PushId> id;
  if (frame.meta.has_push_id()) {
    id = core::PushId{frame.meta.push_id().writer(), frame.meta.push_id().incarnation(), frame.meta.push_id().seq(),
                      frame.meta.push_id().origin_seq()};
  }
  Status st;
  {
    // A scale-out or scale-in may have moved keys while the values arrived: then the
    // push is refused as one arriving now would be, and nothing is applied.
    std::shared_lock<std::shared_mutex> lock(view_mu_);
    st = CheckOwned(tail->keys().data(), tail->keys().size());
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
  messenger().Reply(conn, frame.meta, st).IgnoreError();
}

void ServerNode::HandlePush(const DataRequest& req, Responder r, bool replica) {
  const char* data = req.payload ? req.payload->data() : "";
  size_t size = req.payload ? req.payload->size() : 0;
  Result<core::KvView> view = core::DecodeKvPairs(data, size, /*expect_values=*/true);
  if (!view.ok()) return r.Fail(view.status());
  // A key held by a push being folded in as it arrives (PushTail: keys of 64 KiB or more)
  // is waited for here, not under the view lock: the loop thread, which feeds that push,
  // takes the view lock.
  const bool large = std::any_of(view->lens, view->lens + view->num_keys,
                                 [](uint32_t l) { return uint64_t{l} * sizeof(float) >= core::kZeroCopyBytes; });
  core::ParamStore::StreamHold hold =
      large ? store_.HoldStreamsOff(view->keys, view->lens, view->num_keys) : core::ParamStore::StreamHold();
  std::shared_lock<std::shared_mutex> lock(view_mu_);
  // A worker's push is applied here and by each live backup of its keys' ranges, the
  // forwards sent before this server applies it (an answer only once all did:
  // docs/reliability.md); a forwarded one here only.
  std::vector<int> backups;
  if (Status owned = CheckOwned(view->keys, view->num_keys, !replica, replica ? nullptr : &backups); !owned.ok()) {
    return r.Fail(owned);
  }
  if (replica) {
    // A range still being copied here (resync): held until its snapshot is installed.
    std::optional<Status> held = HoldForResync(req, r);
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
  auto apply = [&] { return store_.Push(view->keys, view->lens, view->values, view->num_keys); };
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

std::function<void(const Status&)> ServerNode::Replicate(const DataRequest& req, std::vector<int> backups,
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
  bool queued = loop()->Run([this, req, backups = std::move(backups), report] {
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
      WithServerConn(backup, [this, req, answered](Result<ConnId> c) {
        if (!c.ok()) return answered(c.status());
        pb::MessageMeta meta = MakeMeta(pb::SEND_DATA, pb::SERVER, rank());
        meta.set_handler(kReplicateHandler);
        if (req.push_id) {
          pb::PushId* id = meta.mutable_push_id();
          id->set_writer(req.push_id->writer);
          id->set_incarnation(req.push_id->incarnation);
          id->set_seq(req.push_id->seq);
          id->set_origin_seq(req.push_id->origin_seq);
        }
        messenger().Call(*c, meta, req.payload, options_.request_timeout,
                         [answered](Result<Frame> res) { answered(res.status()); });
      });
    }
  });
  if (!queued) report(Stopped());
  return report;
}

std::optional<Status> ServerNode::ClaimPush(const core::PushId& id) {
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
