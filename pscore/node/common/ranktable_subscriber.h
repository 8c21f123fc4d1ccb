// RankTableSubscriber: follows a scheduler's rank table over the native protocol.
// Connects, sends SUBSCRIBE_RANKTABLE with ClientInfo{jobId, role}, then calls on_table for
// every RankTableStream the scheduler pushes (the current table first). With
// reconnect_for > 0 a lost stream is subscribed again (backoff 100 ms doubling to 2 s) until
// that long has passed since the loss, so a subscriber follows a scheduler restart (the
// restarted scheduler's current table comes first, and may equal the last one seen);
// on_close runs only when it gives up, or at once for an unknown jobId. Callbacks run on
// the loop thread. Start/Stop from any thread but the loop's; owned by its user.
// Register() makes the job's publisher registration (REGISTER_RANKTABLE) and binds the
// next Start() to it; a stream so bound ends, on_close getting the scheduler's kAborted,
// when the job is registered again (never subscribed again after that).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "pscore/comm/backoff.h"
#include "pscore/comm/event_loop.h"
#include "pscore/comm/messenger.h"
#include "pscore/proto/comm.pb.h"

namespace pscore::node {

struct RankTableSubscriberOptions {
  std::string host = "127.0.0.1";
  int port = 0;
  std::string job_id = "default";
  std::string role = "worker";
  Duration timeout = std::chrono::seconds(10);  // connect and subscribe
  Duration reconnect_for = Duration::zero();    // after a lost stream (0: end with it)
  // The publisher registration to subscribe under (Register() sets it); 0: anonymous.
  uint64_t registration = 0;
  std::string cluster_token;  // the job's token, when it has one
  std::shared_ptr<comm::TlsContext> tls;  // TLS to the scheduler; null: plaintext
};

class RankTableSubscriber {
 public:
  using TableCallback = std::function<void(const pb::RankTableStream&)>;
  using CloseCallback = std::function<void(const Status&)>;

  // loop: shared loop to run on (nullptr: the subscriber owns one).
  RankTableSubscriber(RankTableSubscriberOptions options, TableCallback on_table,
                      CloseCallback on_close = nullptr, comm::EventLoop* loop = nullptr);
  ~RankTableSubscriber();

  // Returns once the scheduler accepted the subscription, or with its refusal
  // (kNotFound for an unknown jobId) or a connect/timeout error.
  Status Start();
  // Before Start: registers options.job_id's publisher with options.role, returns the
  // registration id and subscribes under it from then on. Refusals as CheckJob's
  // (kNotFound for another job), or a connect/timeout error.
  Result<uint64_t> Register();
  // Closes the link. Idempotent.
  void Stop();
  uint64_t received() const { return received_.load(); }
  uint64_t lost() const { return lost_.load(); }                  // streams lost while reconnecting is on
  uint64_t resubscribed() const { return resubscribed_.load(); }  // streams regained

 private:
  // Loop thread: connect and subscribe; done gets the scheduler's answer or why not.
  void Subscribe(std::function<void(Status)> done);
  void OnLost(const Status& why);
  void RetryLater(const Status& last);
  void OnFrame(comm::ConnId conn, comm::Frame&& frame);

  RankTableSubscriberOptions options_;
  TableCallback on_table_;
  CloseCallback on_close_;
  std::unique_ptr<comm::EventLoop> owned_loop_;
  comm::EventLoop* loop_;
  std::unique_ptr<comm::Messenger> messenger_;
  comm::ConnId conn_ = comm::kNoConn;  // the subscribed link (loop thread)
  std::atomic<uint64_t> received_{0};
  std::atomic<uint64_t> lost_{0};
  std::atomic<uint64_t> resubscribed_{0};
  std::atomic<bool> stopped_{false};
  // Reconnecting (loop thread): when the stream was lost, the next wait, the pending retry.
  TimePoint lost_at_;
  comm::Backoff backoff_{std::chrono::milliseconds(100), std::chrono::seconds(2)};
  comm::TimerId retry_timer_ = 0;
};

}  // namespace pscore::node
