// RankTableSubscriber: follows a scheduler's rank table over the native protocol.
// Connects, sends SUBSCRIBE_RANKTABLE with ClientInfo{jobId, role}, then calls on_table for
// every RankTableStream the scheduler pushes (the current table first). Callbacks run on
// the loop thread. Start/Stop from any thread but the loop's; owned by its user.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "comm/event_loop.h"
#include "comm/messenger.h"
#include "proto/comm.pb.h"

namespace pscore::node {

struct RankTableSubscriberOptions {
  std::string host = "127.0.0.1";
  int port = 0;
  std::string job_id = "default";
  std::string role = "worker";
  Duration timeout = std::chrono::seconds(10);  // connect and subscribe
  std::string cluster_token;  // the job's token, when it has one
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
  // Closes the link. Idempotent.
  void Stop();
  uint64_t received() const { return received_.load(); }

 private:
  void OnFrame(comm::ConnId conn, comm::Frame&& frame);

  RankTableSubscriberOptions options_;
  TableCallback on_table_;
  CloseCallback on_close_;
  std::unique_ptr<comm::EventLoop> owned_loop_;
  comm::EventLoop* loop_;
  std::unique_ptr<comm::Messenger> messenger_;
  comm::ConnId conn_ = comm::kNoConn;
  std::atomic<uint64_t> received_{0};
  bool stopped_ = false;
};

}  // namespace pscore::node
