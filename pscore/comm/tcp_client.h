// TcpClient: keeps one connection to host:port open, reconnecting with backoff after a
// loss until ConnectOptions::timeout passes without success; then it reports failure.
// A connection lost within max_backoff of being made (a peer that accepts and closes at
// once, e.g. at its connection cap) is dialed again only after a backoff that doubles
// from initial_backoff up to max_backoff, so such a peer is not hammered.
// Owned by its user; loop thread only; the Transport must outlive it.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "pscore/comm/alive.h"
#include "pscore/comm/backoff.h"
#include "pscore/comm/event_loop.h"
#include "pscore/comm/transport.h"

namespace pscore::comm {

class TcpClient {
 public:
  struct Callbacks {
    std::function<void(ConnId)> on_connected;       // each (re)connection
    std::function<void(const Status&)> on_lost;     // the connection closed; reconnecting
    std::function<void(const Status&)> on_failed;   // gave up (connect timeout passed)
  };
  TcpClient(Transport* transport, std::string host, int port, ConnectOptions options,
            bool reconnect, Callbacks callbacks);
  ~TcpClient();

  void Start();
  // Stops reconnecting and closes the connection. Idempotent.
  void Stop();
  ConnId conn() const { return conn_; }
  bool connected() const { return conn_ != kNoConn; }
  const std::string& target() const { return target_; }

 private:
  void Dial();
  void Redial();  // after a loss: at once, or after a backoff when the link was short-lived

  Transport* transport_;
  std::string host_;
  int port_;
  std::string target_;
  ConnectOptions options_;
  bool reconnect_;
  Callbacks callbacks_;
  ConnId conn_ = kNoConn;
  bool stopped_ = false;
  TimePoint connected_at_{};
  Backoff redial_backoff_;  // reset when the last link lived long enough
  TimerId redial_timer_ = 0;
  AliveToken alive_;  // callbacks do nothing once *this is gone
};

}  // namespace pscore::comm
