#include "pscore/comm/blocking_link.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "pscore/comm/auth.h"
#include "pscore/comm/transport.h"

namespace pscore::comm {
namespace {

// Frames skipped while waiting for one answer before the peer is called misbehaving.
constexpr int kMaxStrayFrames = 64;

// Rounded up, so a wait does not end before its deadline.
int MillisLeft(TimePoint deadline) {
  auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  return left.count() <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left.count(), 1 << 30));
}

// Waits until fd is ready for `events`; kTimeout at the deadline.
Status WaitReady(int fd, short events, TimePoint deadline, const char* what) {
  for (;;) {
    pollfd p{fd, events, 0};
    int r = ::poll(&p, 1, MillisLeft(deadline));
    if (r > 0) return Status::Ok();
    if (r == 0 && std::chrono::steady_clock::now() < deadline) continue;
    if (r == 0) return Status(Code::kTimeout, std::string(what) + ": deadline passed");
    if (errno != EINTR) return Status(Code::kUnavailable, std::string(what) + ": poll: " + std::strerror(errno));
  }
}

BufferPtr Serialized(const google::protobuf::MessageLite& msg) {
  BufferPtr buf = Buffer::Allocate(msg.ByteSizeLong());
  msg.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(buf->data()));
  return buf;
}

std::string MetaBytes(const pb::MessageMeta& meta) {
  std::string out;
  meta.SerializeToString(&out);
  return out;
}

}  // namespace

Result<std::unique_ptr<BlockingLink>> BlockingLink::Dial(const std::string& host, int port,
                                                         const BlockingLinkOptions& options) {
  sockaddr_storage addr;
  PSCORE_RETURN_IF_ERROR(ResolveAddress(host, port, &addr));
  const std::string where = host + ":" + std::to_string(port);
  int fd = ::socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status(Code::kUnavailable, "socket: " + std::string(std::strerror(errno)));
  std::unique_ptr<BlockingLink> link(new BlockingLink(fd, options.limits));
  const TimePoint deadline = std::chrono::steady_clock::now() + options.connect_timeout;
  const socklen_t len = addr.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    if (errno != EINPROGRESS) {
      return link->Fail(Status(Code::kUnavailable, "connect " + where + ": " + std::strerror(errno)));
    }
    Status ready = WaitReady(fd, POLLOUT, deadline, ("connect " + where).c_str());
    if (!ready.ok()) return link->Fail(ready);
    int err = 0;
    socklen_t err_len = sizeof(err);
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &err_len);
    if (err != 0) return link->Fail(Status(Code::kUnavailable, "connect " + where + ": " + std::strerror(err)));
  }
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  // From here on the socket blocks, bounded by SO_RCVTIMEO/SO_SNDTIMEO (SetTimeout): a
  // round trip is one writev and, usually, one recv.
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  if (!options.auth_token.empty()) PSCORE_RETURN_IF_ERROR(link->Handshake(options.auth_token, deadline));
  return link;
}

BlockingLink::~BlockingLink() {
  std::lock_guard<std::mutex> lock(close_mu_);
  if (fd_ >= 0) ::close(fd_);
}

Status BlockingLink::Fail(Status st) {
  std::lock_guard<std::mutex> lock(close_mu_);
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  return st;
}

void BlockingLink::Interrupt() {
  // Under close_mu_ fd_ is still this link's socket: the number cannot have been closed
  // and handed to another open meanwhile. A blocked recv then returns 0, a send EPIPE.
  std::lock_guard<std::mutex> lock(close_mu_);
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

// The connecting side of Transport's handshake (pscore/comm/transport_auth.cc): the listener's
// challenge, our proof, its verdict.
Status BlockingLink::Handshake(const std::string& token, TimePoint deadline) {
  Result<Frame> challenge = ReadFrame(deadline);
  if (!challenge.ok()) return challenge.status();
  pb::HelloMessage hello;
  if (challenge->meta.cmd() != pb::HELLO || challenge->meta.is_response() || !challenge->payload ||
      !hello.ParseFromArray(challenge->payload->data(), static_cast<int>(challenge->payload->size())) ||
      hello.nonce().size() != kNonceBytes) {
    return Fail(Status(Code::kPermissionDenied, "expected a token challenge, got " +
                                                    pb::NodeCommand_Name(challenge->meta.cmd())));
  }
  pb::HelloMessage proof;
  proof.set_auth_proof(ProveToken(token, hello.nonce()));
  pb::MessageMeta meta;
  meta.set_cmd(pb::HELLO);
  meta.set_oneway(true);
  PSCORE_RETURN_IF_ERROR(WriteFrame(meta, Serialized(proof), deadline));
  Result<Frame> verdict = ReadFrame(deadline);
  if (!verdict.ok()) return verdict.status();
  if (verdict->meta.cmd() != pb::HELLO || !verdict->meta.is_response()) {
    return Fail(Status(Code::kPermissionDenied, "no token verdict"));
  }
  if (verdict->meta.status_code() != 0) {
    return Fail(Status(CodeFromInt(verdict->meta.status_code()), "peer refused us: " + verdict->meta.error()));
  }
  return Status::Ok();
}

Status BlockingLink::WriteFrame(const pb::MessageMeta& meta, const BufferPtr& payload, TimePoint deadline) {
  if (fd_ < 0) return Status(Code::kUnavailable, "link is closed");
  std::string m = MetaBytes(meta);
  const size_t data_len = payload ? payload->size() : 0;
  // Padded as a Connection pads (frame.h), so that the payload starts 8-byte aligned in
  // the stream and the receiver can take a small one in place.
  const size_t pad = data_len > 0 ? MetaPadBytes(out_offset_, m.size()) : 0;
  if (pad > 0) {
    const size_t fields = m.size();
    m.resize(fields + pad);
    StoreMetaPad(pad, &m[fields]);
  }
  FrameHeader h;
  h.meta_len = static_cast<uint32_t>(m.size());
  h.data_len = data_len;
  char head[kHeaderBytes];
  StoreHeader(h, head);
  iovec iov[3] = {{head, kHeaderBytes},
                  {const_cast<char*>(m.data()), m.size()},
                  {payload ? payload->data() : nullptr, data_len}};
  int first = 0;
  while (first < 3) {
    PSCORE_RETURN_IF_ERROR(SetTimeout(SO_SNDTIMEO, &snd_ms_, deadline, "write"));
    // sendmsg, not writev: MSG_NOSIGNAL makes a write to a peer that is gone fail with
    // EPIPE instead of raising SIGPIPE on the caller's thread.
    msghdr msg{};
    msg.msg_iov = iov + first;
    msg.msg_iovlen = static_cast<size_t>(3 - first);
    ssize_t n = ::sendmsg(fd_, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;  // the deadline decides
      return Fail(Status(Code::kUnavailable, "write: " + std::string(std::strerror(errno))));
    }
    size_t done = static_cast<size_t>(n);
    while (first < 3 && done >= iov[first].iov_len) done -= iov[first++].iov_len;
    if (first < 3) {
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + done;
      iov[first].iov_len -= done;
    }
  }
  out_offset_ += kHeaderBytes + m.size() + data_len;
  return Status::Ok();
}

Status BlockingLink::SetTimeout(int option, int* current_ms, TimePoint deadline, const char* what) {
  const int left = MillisLeft(deadline);
  if (left == 0) return Fail(Status(Code::kTimeout, std::string(what) + ": deadline passed"));
  // Only when it must shrink, or grow by a lot (a new call with a longer deadline): in a
  // steady run of calls with one timeout this is no system call at all. A wait that ends
  // early is retried by the caller's loop, which checks the deadline.
  if (*current_ms == 0 || left < *current_ms || left > *current_ms + 1000) {
    timeval tv{left / 1000, (left % 1000) * 1000};
    if (::setsockopt(fd_, SOL_SOCKET, option, &tv, sizeof(tv)) != 0) {
      return Fail(Status(Code::kUnavailable, std::string(what) + ": setsockopt: " + std::strerror(errno)));
    }
    *current_ms = left;
  }
  return Status::Ok();
}

Status BlockingLink::ReadExact(char* out, size_t n, TimePoint deadline) {
  constexpr size_t kInputBytes = 64 << 10;
  constexpr size_t kDirectBytes = 16 << 10;  // longer reads skip the input buffer
  size_t got = std::min(n, in_end_ - in_begin_);
  if (got > 0) std::memcpy(out, in_buf_->data() + in_begin_, got);
  copied_ += got;
  in_begin_ += got;
  if (in_begin_ == in_end_) in_begin_ = in_end_ = 0;
  while (got < n) {
    PSCORE_RETURN_IF_ERROR(SetTimeout(SO_RCVTIMEO, &rcv_ms_, deadline, "read"));
    const bool direct = n - got >= kDirectBytes;
    // The input buffer is empty here. Its bytes sit at their stream offset modulo 8 (so a
    // padded payload lies aligned in it); one that was lent out is never written again.
    if (!direct && (!in_buf_ || lent_)) {
      in_buf_ = Buffer::Allocate(kInputBytes + kPayloadAlign);
      lent_ = false;
    }
    const size_t at = received_ % kPayloadAlign;
    ssize_t r = direct ? ::recv(fd_, out + got, n - got, 0) : ::recv(fd_, in_buf_->data() + at, kInputBytes, 0);
    if (r == 0) return Fail(Status(Code::kUnavailable, "peer closed the connection"));
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;  // the deadline decides
      return Fail(Status(Code::kUnavailable, "read: " + std::string(std::strerror(errno))));
    }
    received_ += static_cast<uint64_t>(r);
    if (direct) {
      got += static_cast<size_t>(r);
      continue;
    }
    const size_t take = std::min(n - got, static_cast<size_t>(r));
    std::memcpy(out + got, in_buf_->data() + at, take);
    copied_ += take;
    got += take;
    in_begin_ = at + take;
    in_end_ = at + static_cast<size_t>(r);
    if (in_begin_ == in_end_) in_begin_ = in_end_ = 0;
  }
  return Status::Ok();
}

Result<Frame> BlockingLink::ReadFrame(TimePoint deadline) {
  if (fd_ < 0) return Status(Code::kUnavailable, "link is closed");
  char head[kHeaderBytes];
  PSCORE_RETURN_IF_ERROR(ReadExact(head, kHeaderBytes, deadline));
  std::optional<FrameHeader> h;
  Status st = ParseHeader(std::string_view(head, kHeaderBytes), limits_, &h);
  if (!st.ok()) return Fail(st);
  std::string meta_bytes(h->meta_len, '\0');
  PSCORE_RETURN_IF_ERROR(ReadExact(meta_bytes.data(), meta_bytes.size(), deadline));
  Frame f;
  if (!f.meta.ParseFromString(meta_bytes)) {
    return Fail(Status(Code::kProtocol, "unparsable meta (" + std::to_string(meta_bytes.size()) + " bytes)"));
  }
  char* buffered = in_end_ > in_begin_ ? in_buf_->data() + in_begin_ : nullptr;
  if (h->data_len > 0 && h->data_len <= in_end_ - in_begin_ &&
      reinterpret_cast<uintptr_t>(buffered) % kPayloadAlign == 0) {
    // All here and aligned (the peer padded its meta): handed out in place, no copy. This
    // input buffer is not written again (lent_).
    f.payload = Buffer::View(in_buf_, buffered, h->data_len);
    in_begin_ += h->data_len;
    lent_ = true;
  } else if (h->data_len > 0) {
    f.payload = Buffer::Allocate(h->data_len);
    const uint64_t before = copied_;
    PSCORE_RETURN_IF_ERROR(ReadExact(f.payload->data(), h->data_len, deadline));
    payload_copied_ += copied_ - before;
  }
  f.wire_bytes = kHeaderBytes + h->meta_len + h->data_len;
  return f;
}

Status BlockingLink::Notify(const pb::MessageMeta& meta, const BufferPtr& payload, Duration timeout) {
  pb::MessageMeta m = meta;
  m.set_oneway(true);
  m.set_is_response(false);
  return WriteFrame(m, payload, std::chrono::steady_clock::now() + timeout);
}

Result<Frame> BlockingLink::Call(pb::MessageMeta meta, const BufferPtr& payload, Duration timeout) {
  const TimePoint deadline = std::chrono::steady_clock::now() + timeout;
  const uint64_t id = next_request_id_++;
  meta.set_request_id(id);
  meta.set_is_response(false);
  meta.set_oneway(false);
  PSCORE_RETURN_IF_ERROR(WriteFrame(meta, payload, deadline));
  for (int stray = 0; stray <= kMaxStrayFrames; ++stray) {
    Result<Frame> f = ReadFrame(deadline);
    if (!f.ok()) return f.status();
    if (!f->meta.is_response() || f->meta.request_id() != id) continue;
    if (f->meta.status_code() != 0) return Status(CodeFromInt(f->meta.status_code()), f->meta.error());
    return f;
  }
  return Fail(Status(Code::kProtocol, "no answer among " + std::to_string(kMaxStrayFrames) + " frames"));
}

}  // namespace pscore::comm
