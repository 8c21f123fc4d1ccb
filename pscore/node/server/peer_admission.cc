#include "pscore/node/server/peer_admission.h"

#include <glog/logging.h>

#include "pscore/node/common/wire.h"

namespace pscore::node {

using comm::ConnId;
using comm::Frame;

namespace {
// Frames queued behind one held HELLO, at most.
constexpr size_t kMaxHeldFrames = 1024;
constexpr uint64_t kMaxHeldBytes = 64ull << 20;
}  // namespace

PeerAdmission::PeerAdmission(Options options, comm::EventLoop* loop, comm::Messenger* messenger,
                             std::function<void(ConnId, Frame&&)> deliver)
    : options_(std::move(options)), loop_(loop), messenger_(messenger), deliver_(std::move(deliver)) {}

// Without a cluster token a HELLO's claim is not proven; with one, the connection has
// already proven the token, and with TLS the certificate names the node.
void PeerAdmission::HandleHello(ConnId conn, const Frame& frame) {
  DCHECK(loop_->InLoopThread());
  pb::HelloMessage hello;
  Status st = ParsePayload(frame, &hello);
  if (st.ok() && options_.tls) {
    const std::string proven = messenger_->transport().PeerIdentity(conn);
    if (proven != hello.node_id()) {
      st = Status(Code::kPermissionDenied,
                  "node '" + hello.node_id() + "' does not match the TLS certificate (CN=" + proven + ")");
    }
  }
  if (st.ok() && !member_ids_.count(hello.node_id())) {
    if (!hello.node_id().empty() && !held_.count(conn)) return Hold(conn, frame.meta, hello.node_id());
    st = Status(Code::kPermissionDenied, "node '" + hello.node_id() + "' is not a member of this job");
  }
  if (!st.ok()) return Refuse(conn, frame.meta, st);
  members_[conn] = hello.node_id();
  messenger_->Reply(conn, frame.meta, Status::Ok()).IgnoreError();
}

void PeerAdmission::Refuse(ConnId conn, const pb::MessageMeta& meta, const Status& why) {
  LOG(WARNING) << "server " << options_.node_id << ": conn " << conn << " "
               << messenger_->transport().PeerAddress(conn) << " refused: " << why;
  messenger_->Reply(conn, meta, why).IgnoreError();
  messenger_->transport().CloseAfterFlush(conn, why);
}

bool PeerAdmission::QueueIfHeld(ConnId conn, Frame& frame) {
  DCHECK(loop_->InLoopThread());
  auto held = held_.find(conn);
  if (held == held_.end()) return false;
  HeldHello& h = held->second;
  h.queued_bytes += frame.payload ? frame.payload->size() : 0;
  h.queued.push_back(std::move(frame));
  if (h.queued.size() > kMaxHeldFrames || h.queued_bytes > kMaxHeldBytes) {
    RefuseHeld(conn, Status(Code::kResourceExhausted, "node '" + h.node_id + "' sent " +
                                                          std::to_string(h.queued.size()) +
                                                          " frames before the metadata listed it"));
  }
  return true;
}

bool PeerAdmission::CheckMember(ConnId conn, const pb::MessageMeta& meta) {
  DCHECK(loop_->InLoopThread());
  if (members_.count(conn)) return true;
  Status why(Code::kPermissionDenied, "peer " + messenger_->transport().PeerAddress(conn) + " sent " +
                                         pb::NodeCommand_Name(meta.cmd()) +
                                         " without identifying itself as a member (HELLO)");
  LOG_EVERY_N(WARNING, 100) << "server " << options_.node_id << ": " << why;
  messenger_->Reply(conn, meta, why).IgnoreError();
  messenger_->transport().CloseAfterFlush(conn, why);
  return false;
}

bool PeerAdmission::IsMember(ConnId conn) const {
  DCHECK(loop_->InLoopThread());
  return members_.count(conn) != 0;
}

bool PeerAdmission::IsHeld(ConnId conn) const {
  DCHECK(loop_->InLoopThread());
  return held_.count(conn) != 0;
}

void PeerAdmission::Hold(ConnId conn, const pb::MessageMeta& hello_meta, const std::string& node_id) {
  HeldHello& h = held_[conn];
  h.node_id = node_id;
  h.hello_meta = hello_meta;
  const Duration hold = options_.hold;
  h.timer = loop_->AddTimer(hold, Duration::zero(), [this, conn, node_id, hold] {
    auto it = held_.find(conn);
    if (it == held_.end()) return;
    it->second.timer = 0;
    RefuseHeld(conn, Status(Code::kPermissionDenied, "node '" + node_id + "' is not a member of this job (not in " +
                                                         "the metadata after " + std::to_string(ToMillis(hold)) +
                                                         " ms)"));
  });
  VLOG(1) << "server " << options_.node_id << ": conn " << conn << " says it is '" << node_id
          << "', not in the metadata yet; holding it";
}

void PeerAdmission::SetMemberIds(std::unordered_set<std::string> ids) {
  DCHECK(loop_->InLoopThread());
  member_ids_ = std::move(ids);
  std::vector<ConnId> admitted;
  for (auto& [conn, h] : held_) {
    if (member_ids_.count(h.node_id)) admitted.push_back(conn);
  }
  for (ConnId conn : admitted) {
    std::optional<HeldHello> h = TakeHeld(conn);
    if (!h) continue;
    members_[conn] = h->node_id;
    messenger_->Reply(conn, h->hello_meta, Status::Ok()).IgnoreError();
    for (Frame& f : h->queued) {
      if (!messenger_->transport().IsOpen(conn)) break;
      deliver_(conn, std::move(f));
    }
  }
}

std::optional<PeerAdmission::HeldHello> PeerAdmission::TakeHeld(ConnId conn) {
  auto it = held_.find(conn);
  if (it == held_.end()) return std::nullopt;
  HeldHello h = std::move(it->second);
  held_.erase(it);
  if (h.timer != 0) loop_->CancelTimer(h.timer);
  return h;
}

void PeerAdmission::RefuseHeld(ConnId conn, const Status& why) {
  std::optional<HeldHello> h = TakeHeld(conn);
  if (!h) return;
  LOG(WARNING) << "server " << options_.node_id << ": conn " << conn << " "
               << messenger_->transport().PeerAddress(conn) << " refused: " << why;
  messenger_->Reply(conn, h->hello_meta, why).IgnoreError();
  for (const Frame& f : h->queued) messenger_->Reply(conn, f.meta, why).IgnoreError();
  messenger_->transport().CloseAfterFlush(conn, why);
}

void PeerAdmission::OnClosed(ConnId conn) {
  DCHECK(loop_->InLoopThread());
  members_.erase(conn);
  TakeHeld(conn);
}

void PeerAdmission::Stop() {
  DCHECK(loop_->InLoopThread());
  while (!held_.empty()) TakeHeld(held_.begin()->first);
}

}  // namespace pscore::node
