// Transport, token handshake (see TransportOptions::auth_token):
//   accepting side  -> HELLO {nonce}                        (one-way challenge)
//   connecting side -> HELLO {auth_proof = HMAC(token, nonce)}
//   accepting side  -> HELLO answer, status OK or kPermissionDenied (then closes)
// Until it completes, no other frame is delivered; a connection that does not finish
// the handshake within auth_timeout is closed.
#include "pscore/comm/auth.h"
#include "pscore/comm/connection.h"
#include "pscore/comm/event_loop.h"
#include "pscore/comm/transport.h"

namespace pscore::comm {
namespace {

// A HELLO's payload is a nonce or a proof (32 bytes each) in a few bytes of protobuf.
constexpr uint64_t kHandshakeMaxPayload = 1024;

pb::MessageMeta HelloMeta(bool response, const Status& st) {
  pb::MessageMeta meta;
  meta.set_cmd(pb::HELLO);
  meta.set_is_response(response);
  meta.set_oneway(!response);
  if (!st.ok()) {
    meta.set_status_code(static_cast<int32_t>(st.code()));
    meta.set_error(st.message());
  }
  return meta;
}

BufferPtr HelloPayload(const pb::HelloMessage& msg) {
  auto buf = Buffer::Allocate(msg.ByteSizeLong());
  msg.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(buf->data()));
  return buf;
}

}  // namespace

void Transport::StartAuth(ConnId id, bool accepted, std::function<void(Result<ConnId>)> ready) {
  // Until the proof is checked only handshake frames may come: a stranger's header must
  // not make the decoder set aside max_message_bytes (256 MiB) for it.
  if (Connection* c = Lookup(id)) c->LimitPayload(kHandshakeMaxPayload);
  PendingAuth& p = pending_auth_[id];
  p.accepted = accepted;
  p.ready = std::move(ready);
  p.timer = loop_->AddTimer(options_.auth_timeout, Duration::zero(), [this, id] {
    auto it = pending_auth_.find(id);
    if (it == pending_auth_.end()) return;
    it->second.timer = 0;
    std::string what = it->second.accepted ? "no token proof from the peer"
                                           : "no token challenge from the peer (does it use a cluster token?)";
    AuthDone(id, Status(Code::kPermissionDenied, what + " within " +
                                                   std::to_string(ToMillis(options_.auth_timeout)) + " ms"));
  });
  if (!accepted) return;  // The dialler waits for the challenge.
  p.nonce = MakeNonce();
  pb::HelloMessage hello;
  hello.set_nonce(p.nonce);
  Send(id, HelloMeta(false, Status::Ok()), HelloPayload(hello)).IgnoreError();
}

void Transport::OnAuthFrame(ConnId id, Frame&& frame) {
  PendingAuth& p = pending_auth_[id];
  pb::HelloMessage hello;
  bool parsed = frame.meta.cmd() == pb::HELLO &&
                hello.ParseFromArray(frame.payload ? frame.payload->data() : "",
                                     frame.payload ? static_cast<int>(frame.payload->size()) : 0);
  if (p.accepted) {
    if (!parsed || frame.meta.is_response()) {
      Status why(Code::kPermissionDenied, "unauthenticated " + pb::NodeCommand_Name(frame.meta.cmd()) +
                                              " before the token proof");
      Send(id, HelloMeta(true, why), nullptr).IgnoreError();
      return AuthDone(id, why);
    }
    if (!VerifyProof(options_.auth_token, p.nonce, hello.auth_proof())) {
      Status why(Code::kPermissionDenied, "wrong cluster token proof");
      Send(id, HelloMeta(true, why), nullptr).IgnoreError();
      return AuthDone(id, why);
    }
    Send(id, HelloMeta(true, Status::Ok()), nullptr).IgnoreError();
    return AuthDone(id, Status::Ok());
  }
  // Connecting side: first the challenge, then the verdict.
  if (frame.meta.cmd() == pb::HELLO && frame.meta.is_response()) {
    Status verdict = frame.meta.status_code() == 0
                         ? Status::Ok()
                         : Status(CodeFromInt(frame.meta.status_code()), "peer refused us: " + frame.meta.error());
    return AuthDone(id, verdict);
  }
  if (!parsed || hello.nonce().size() != kNonceBytes) {
    return AuthDone(id, Status(Code::kPermissionDenied, "expected a token challenge, got " +
                                                            pb::NodeCommand_Name(frame.meta.cmd())));
  }
  pb::HelloMessage proof;
  proof.set_auth_proof(ProveToken(options_.auth_token, hello.nonce()));
  Send(id, HelloMeta(false, Status::Ok()), HelloPayload(proof)).IgnoreError();
}

void Transport::AuthDone(ConnId id, const Status& st) {
  auto it = pending_auth_.find(id);
  if (it == pending_auth_.end()) return;
  PendingAuth p = std::move(it->second);
  pending_auth_.erase(it);
  if (p.timer != 0) loop_->CancelTimer(p.timer);
  if (st.ok()) {
    VLOG(1) << "conn " << id << " " << PeerAddress(id) << ": token handshake done";
    if (Connection* c = Lookup(id)) c->LimitPayload(options_.limits.max_message_bytes);
    return Opened(id, p.accepted, std::move(p.ready));
  }
  LOG(WARNING) << "conn " << id << " " << PeerAddress(id) << ": authentication failed: " << st;
  // Let the verdict frame go out before the close (the close flushes queued writes first).
  Connection* c = Lookup(id);
  if (c != nullptr) c->CloseAfterFlush(st);
  if (p.ready) p.ready(st);
}

}  // namespace pscore::comm
