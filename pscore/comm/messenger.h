// Messenger: request/response and one-way messages over a Transport.
// A request carries a fresh request_id and a deadline; the answer (is_response, same
// request_id) completes it; a closed connection fails all its pending requests at once.
// Non-response frames go to the request handler, which answers with Reply. Loop thread
// only; owned by the node (or test) that creates it.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "pscore/comm/event_loop.h"
#include "pscore/comm/request_tracker.h"
#include "pscore/comm/transport.h"

namespace pscore::comm {

class Messenger {
 public:
  using RequestHandler = std::function<void(ConnId, Frame&&)>;
  struct Handlers {
    RequestHandler on_request;
    std::function<void(ConnId, bool accepted)> on_open;
    std::function<void(ConnId, const Status&)> on_close;
    // Optional: a stream for the tail of a request whose meta names a payload head
    // (FrameDecoder::StreamFn); its frame then arrives with the head and the stream.
    std::function<std::shared_ptr<TailStream>(ConnId, const pb::MessageMeta&, uint64_t tail)> stream;
  };

  Messenger(EventLoop* loop, TransportOptions options, Handlers handlers);
  ~Messenger();

  Transport& transport() { return *transport_; }
  EventLoop* loop() const { return loop_; }

  // Sends a request; cb runs once with the answer, or an error if the answer carries a
  // non-OK status, the deadline passes, or the connection is lost. With a sink, an answer
  // sent as head + tail of exactly sink.len bytes has its tail read into sink.dst (the
  // Frame then holds the head, tail_bytes says so); any other answer arrives as usual.
  void Call(ConnId conn, pb::MessageMeta meta, Payload payload, Duration timeout,
            ResponseCallback cb, AnswerSink sink = {});
  // One-way message (no answer expected).
  Status Notify(ConnId conn, pb::MessageMeta meta, Payload payload);
  // Answers `request` (echoes cmd and request_id) with status and payload. A payload with
  // tail slices names its head's size in the answer's meta (payload_head), so the
  // requester may read the tail into memory of its own (AnswerSink).
  Status Reply(ConnId conn, const pb::MessageMeta& request, const Status& status,
               Payload payload = nullptr);
  // The fields of `request` that Reply reads (cmd, request id, user cmd, oneway): what an
  // answer given later needs to keep, without the request's strings and push id.
  static pb::MessageMeta ReplyTo(const pb::MessageMeta& request);
  // The same with a protobuf answer, serialised straight into the write batch when small.
  Status Reply(ConnId conn, const pb::MessageMeta& request, const google::protobuf::MessageLite& body);
  // After a request goes out with no other pending, or an answer leaves none pending, the
  // loop polls without sleeping for `d` (EventLoop::SpinFor): a caller waiting on one
  // small request at a time then finds the answer, and the loop its next request, without
  // a thread wake-up on either side. Requests in flight together start no window, so a
  // pipelined sender does not take a core from the threads it feeds. 0 (the default): off.
  void set_poll_spin(Duration d) { poll_spin_ = d; }
  // Fails pending requests and closes all connections. Idempotent.
  void Shutdown();
  size_t pending_requests() const { return tracker_.pending(); }

 private:
  void OnFrame(ConnId conn, Frame&& frame);
  void OnClose(ConnId conn, const Status& why);
  std::string Describe(ConnId conn, int cmd) const;

  EventLoop* loop_;
  Handlers handlers_;
  std::unique_ptr<Transport> transport_;
  RequestTracker tracker_;
  std::unordered_map<ConnId, std::string> peers_;  // peer address per connection with requests
  TimerId expiry_timer_ = 0;
  Duration poll_spin_{0};
  bool shut_down_ = false;
};

// Converts the status fields of an answer's meta to a Status.
Status StatusOf(const pb::MessageMeta& meta);

}  // namespace pscore::comm
