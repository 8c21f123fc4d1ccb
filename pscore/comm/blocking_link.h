// BlockingLink: one dialled connection driven by the calling thread with plain socket
// calls, no event loop. A request is written by the caller and its answer read by the
// caller: a round trip costs the two wake-ups of a blocking ping-pong, where handing the
// request to a loop thread and the answer back would add two more.
//
// Same frames and token handshake as Transport (docs/protocol.md). Every wait has the
// caller's deadline. One thread at a time; after any error the link is broken (closed):
// drop it and dial again. The link never serves requests: frames from the peer that are
// not the awaited answer are read and discarded (bounded).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "pscore/comm/frame.h"
#include "pscore/comm/frame_decoder.h"
#include "pscore/core/buffer.h"
#include "pscore/core/clock.h"
#include "pscore/core/status.h"
#include "pscore/proto/comm.pb.h"

namespace pscore::comm {

struct BlockingLinkOptions {
  Limits limits;
  std::string auth_token;  // empty: no handshake
  Duration connect_timeout = std::chrono::seconds(5);
};

class BlockingLink {
 public:
  // Connects and, with a token, completes the handshake before returning.
  static Result<std::unique_ptr<BlockingLink>> Dial(const std::string& host, int port,
                                                     const BlockingLinkOptions& options);
  ~BlockingLink();
  BlockingLink(const BlockingLink&) = delete;
  BlockingLink& operator=(const BlockingLink&) = delete;

  // A one-way frame (no answer expected).
  Status Notify(const pb::MessageMeta& meta, const BufferPtr& payload, Duration timeout);
  // Sends meta (its request_id is assigned here) and payload; returns the answer. An
  // answer whose meta carries an error is returned as that error (a Status with the
  // peer's code and message); transport failures are kUnavailable or kTimeout and break
  // the link.
  Result<Frame> Call(pb::MessageMeta meta, const BufferPtr& payload, Duration timeout);
  bool broken() const { return fd_ < 0; }
  // Any thread: makes a Notify or Call blocked on this link (or the next one) end now with
  // kUnavailable, breaking the link, by shutting its socket down. For an owner that learns
  // elsewhere that the peer is silent (stopped, cut off) and must not wait out the call's
  // deadline. Safe against the owning thread closing the link meanwhile.
  void Interrupt();
  // Payload bytes of answers copied out of the link's read buffer so far (a payload of at
  // least 16 KiB still missing is read straight into its frame; one that is all in the
  // buffer and 8-byte aligned there, as a padding peer's is, is handed out in place: a
  // view that keeps the buffer, up to 64 KiB, alive).
  uint64_t payload_bytes_copied() const { return payload_copied_; }

 private:
  BlockingLink(int fd, Limits limits) : fd_(fd), limits_(limits) {}
  Status Handshake(const std::string& token, TimePoint deadline);
  Status WriteFrame(const pb::MessageMeta& meta, const BufferPtr& payload, TimePoint deadline);
  Result<Frame> ReadFrame(TimePoint deadline);
  Status ReadExact(char* out, size_t n, TimePoint deadline);
  // Sets SO_RCVTIMEO or SO_SNDTIMEO to what is left until the deadline, when needed.
  Status SetTimeout(int option, int* current_ms, TimePoint deadline, const char* what);
  Status Fail(Status st);  // closes the link, returns st

  int fd_;                // written (closed) under close_mu_ by the owning thread only
  std::mutex close_mu_;   // Interrupt's shutdown against a close and the reuse of fd_'s number
  Limits limits_;
  uint64_t next_request_id_ = 1;
  int rcv_ms_ = 0, snd_ms_ = 0;  // the socket's timeouts now (0: none set)
  BufferPtr in_buf_;             // bytes received and not yet consumed: [in_begin_, in_end_)
  size_t in_begin_ = 0, in_end_ = 0;
  bool lent_ = false;            // a payload in in_buf_ was handed out: never write it again
  uint64_t received_ = 0;        // bytes received since the link opened
  uint64_t copied_ = 0;          // bytes ReadExact copied out of in_buf_
  uint64_t payload_copied_ = 0;  // of them, payload bytes
  uint64_t out_offset_ = 0;      // bytes written since the link opened (for padding)
};

}  // namespace pscore::comm
