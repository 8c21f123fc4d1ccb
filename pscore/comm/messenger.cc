#include "pscore/comm/messenger.h"

#include "pscore/comm/event_loop.h"

namespace pscore::comm {
namespace {
constexpr auto kExpiryPeriod = std::chrono::milliseconds(5);
}

Status StatusOf(const pb::MessageMeta& meta) {
  if (meta.status_code() == 0) return Status::Ok();
  return Status(CodeFromInt(meta.status_code()), meta.error());
}

std::string Messenger::Describe(ConnId conn, int cmd) const {
  auto p = peers_.find(conn);
  std::string peer = p != peers_.end() ? p->second : transport_->PeerAddress(conn);
  if (peer.empty()) peer = "connection " + std::to_string(conn);
  return pb::NodeCommand_Name(static_cast<pb::NodeCommand>(cmd)) + " to " + peer;
}

Messenger::Messenger(EventLoop* loop, TransportOptions options, Handlers handlers)
    : loop_(loop), handlers_(std::move(handlers)), tracker_([this](ConnId c, int cmd) { return Describe(c, cmd); }) {
  Transport::Handlers th;
  th.on_frame = [this](ConnId c, Frame&& f) { OnFrame(c, std::move(f)); };
  th.on_open = handlers_.on_open;
  th.on_close = [this](ConnId c, const Status& why) { OnClose(c, why); };
  th.sink = [this](ConnId c, const pb::MessageMeta& meta, uint64_t tail) -> char* {
    if (!meta.is_response() || meta.status_code() != 0) return nullptr;
    return tracker_.TakeSink(meta.request_id(), c, tail);
  };
  if (handlers_.stream) {
    th.stream = [this](ConnId c, const pb::MessageMeta& meta, uint64_t tail) -> std::shared_ptr<TailStream> {
      if (meta.is_response()) return nullptr;
      return handlers_.stream(c, meta, tail);
    };
  }
  transport_ = std::make_unique<Transport>(loop, options, std::move(th));
  // A request whose answer is being read into its sink may end first (deadline, a
  // duplicate answer): the connection must stop writing there before the callback runs.
  tracker_.set_on_sink_release([this](ConnId c, uint64_t id) { transport_->DropSink(c, id); });
}

Messenger::~Messenger() {
  if (!shut_down_ && loop_->InLoopThread()) Shutdown();
}

void Messenger::Shutdown() {
  DCHECK(loop_->InLoopThread());
  if (shut_down_) return;
  shut_down_ = true;
  if (expiry_timer_ != 0) loop_->CancelTimer(expiry_timer_);
  expiry_timer_ = 0;
  // Pending requests first, while their connections are open: closing them first would
  // fail the requests as lost links (kUnavailable), which callers may retry.
  tracker_.FailAll(Status(Code::kCancelled, "messenger shut down"));
  transport_->Shutdown();
}

void Messenger::Call(ConnId conn, pb::MessageMeta meta, Payload payload, Duration timeout,
                     ResponseCallback cb, AnswerSink sink) {
  DCHECK(loop_->InLoopThread());
  if (shut_down_) {
    cb(Status(Code::kCancelled, Describe(conn, meta.cmd()) + ": messenger shut down"));
    return;
  }
  if (peers_.find(conn) == peers_.end()) peers_.emplace(conn, transport_->PeerAddress(conn));
  uint64_t id = tracker_.Add(conn, std::chrono::steady_clock::now() + timeout, meta.cmd(), std::move(cb), sink);
  meta.set_request_id(id);
  meta.set_is_response(false);
  // As for an answer: a receiver may take the tail apart from the head (TailStream).
  if (!payload.tail.empty() && payload.head != nullptr) meta.set_payload_head(payload.head->size());
  Status st = transport_->Send(conn, meta, std::move(payload));
  if (!st.ok()) {
    tracker_.Complete(id, st);
    // A closed connection's index is dropped when it closes; this call made a new one.
    if (!transport_->IsOpen(conn)) tracker_.FailConnection(conn, st);
    return;
  }
  if (poll_spin_.count() > 0 && tracker_.pending() == 1) loop_->SpinFor(poll_spin_);
  if (expiry_timer_ == 0) {
    expiry_timer_ = loop_->AddTimer(kExpiryPeriod, kExpiryPeriod, [this] {
      tracker_.Expire(std::chrono::steady_clock::now());
    });
  }
}

Status Messenger::Notify(ConnId conn, pb::MessageMeta meta, Payload payload) {
  meta.set_oneway(true);
  meta.set_request_id(0);
  return transport_->Send(conn, meta, std::move(payload));
}

namespace {

// What an answer echoes of its request: cmd, request id, user cmd.
pb::MessageMeta Echo(const pb::MessageMeta& request) {
  pb::MessageMeta meta;
  meta.set_cmd(request.cmd());
  meta.set_request_id(request.request_id());
  meta.set_user_cmd(request.user_cmd());
  return meta;
}

pb::MessageMeta AnswerMeta(const pb::MessageMeta& request, const Status& status) {
  pb::MessageMeta meta = Echo(request);
  meta.set_is_response(true);
  if (!status.ok()) {
    meta.set_status_code(static_cast<int32_t>(status.code()));
    meta.set_error(status.message());
  }
  return meta;
}

}  // namespace

pb::MessageMeta Messenger::ReplyTo(const pb::MessageMeta& request) {
  pb::MessageMeta kept = Echo(request);
  kept.set_oneway(request.oneway());
  return kept;
}

Status Messenger::Reply(ConnId conn, const pb::MessageMeta& request, const Status& status,
                        Payload payload) {
  if (request.oneway()) return Status::Ok();
  pb::MessageMeta meta = AnswerMeta(request, status);
  if (!payload.tail.empty() && payload.head != nullptr) meta.set_payload_head(payload.head->size());
  return transport_->Send(conn, meta, std::move(payload));
}

Status Messenger::Reply(ConnId conn, const pb::MessageMeta& request, const google::protobuf::MessageLite& body) {
  if (request.oneway()) return Status::Ok();
  return transport_->Send(conn, AnswerMeta(request, Status::Ok()), body);
}

void Messenger::OnFrame(ConnId conn, Frame&& frame) {
  if (frame.tail_dropped) {
    // Its request ended while the tail arrived (the sink was released): nobody waits.
    VLOG(1) << "conn " << conn << ": answer " << frame.meta.request_id() << " dropped after its request ended";
    return;
  }
  if (frame.meta.is_response()) {
    uint64_t id = frame.meta.request_id();
    Status st = StatusOf(frame.meta);
    // Only the connection the request went out on may answer it.
    bool known = st.ok() ? tracker_.CompleteFrom(conn, id, std::move(frame)) : tracker_.CompleteFrom(conn, id, st);
    if (!known) VLOG(1) << "conn " << conn << ": late, unknown or foreign answer " << id;
    if (known && poll_spin_.count() > 0 && tracker_.pending() == 0) loop_->SpinFor(poll_spin_);
    return;
  }
  if (handlers_.on_request) handlers_.on_request(conn, std::move(frame));
}

void Messenger::OnClose(ConnId conn, const Status& why) {
  tracker_.FailConnection(conn, Status(Code::kUnavailable, "connection lost (" + why.ToString() + ")"));
  peers_.erase(conn);
  if (handlers_.on_close) handlers_.on_close(conn, why);
}

}  // namespace pscore::comm
