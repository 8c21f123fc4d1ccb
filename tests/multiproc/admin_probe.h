// AdminProbe: a minimal in-test admin client. It sends pb::ADMIN requests to a
// scheduler over the native protocol and returns the parsed pb::AdminResponse. Owns its
// own loop; blocking calls from the test thread only (each with a deadline).
#pragma once

#include <chrono>
#include <future>
#include <memory>
#include <string>

#include "pscore/comm/event_loop.h"
#include "pscore/comm/messenger.h"
#include "pscore/node/common/wire.h"
#include "multiproc/test_tls.h"

namespace pscore::testing {

class AdminProbe {
 public:
  explicit AdminProbe(int scheduler_port) : port_(scheduler_port), loop_("admin-probe") {
    comm::Messenger::Handlers h;
    h.on_request = [](comm::ConnId, comm::Frame&&) {};  // the scheduler pushes nothing to admins
    comm::TransportOptions t;
    t.tls = TestTlsContext("admin");  // the TLS pass (test_tls.h); null otherwise
    messenger_ = std::make_unique<comm::Messenger>(&loop_, t, std::move(h));
    started_ = loop_.Start().ok();
  }
  ~AdminProbe() {
    if (!started_) return;
    RunOnLoop<int>([this] {
      messenger_->Shutdown();
      return 0;
    });
    loop_.Stop().IgnoreError();
  }
  AdminProbe(const AdminProbe&) = delete;
  AdminProbe& operator=(const AdminProbe&) = delete;

  // One request: op "status", "nodes", ... (connects on first use; reconnects after a loss).
  Result<pb::AdminResponse> Call(const std::string& op, std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
    if (!started_) return Status(Code::kInternal, "admin probe loop did not start");
    auto done = std::make_shared<std::promise<Result<pb::AdminResponse>>>();
    auto fut = done->get_future();
    loop_.Post([this, op, timeout, done] {
      auto send = [this, op, timeout, done](comm::ConnId conn) {
        pb::AdminRequest req;
        req.set_op(op);
        messenger_->Call(conn, node::MakeMeta(pb::ADMIN, pb::ADMIN_CLIENT, -1), node::ToBuffer(req), timeout,
                         [done](Result<comm::Frame> r) {
                           if (!r.ok()) return done->set_value(r.status());
                           pb::AdminResponse resp;
                           Status st = node::ParsePayload(*r, &resp);
                           if (!st.ok()) return done->set_value(st);
                           done->set_value(resp);
                         });
      };
      if (conn_ != comm::kNoConn && messenger_->transport().IsOpen(conn_)) return send(conn_);
      comm::ConnectOptions co;
      co.timeout = timeout;
      messenger_->transport().Connect("127.0.0.1", port_, co, [this, send, done](Result<comm::ConnId> c) {
        if (!c.ok()) return done->set_value(c.status());
        conn_ = *c;
        send(conn_);
      });
    });
    if (fut.wait_for(timeout + std::chrono::seconds(2)) != std::future_status::ready) {
      return Status(Code::kTimeout, "admin " + op + ": no answer");
    }
    return fut.get();
  }

  // The node named node_id in a "nodes" answer, or nullptr.
  static const pb::ServersMeta* FindNode(const pb::AdminResponse& resp, const std::string& node_id) {
    for (const pb::ServersMeta& m : resp.nodes()) {
      if (m.node_id() == node_id) return &m;
    }
    return nullptr;
  }

 private:
  template <typename T>
  T RunOnLoop(std::function<T()> fn) {
    std::packaged_task<T()> task(std::move(fn));
    auto fut = task.get_future();
    loop_.Post([&task] { task(); });
    return fut.get();
  }

  int port_;
  comm::EventLoop loop_;
  std::unique_ptr<comm::Messenger> messenger_;
  comm::ConnId conn_ = comm::kNoConn;  // loop thread
  bool started_ = false;
};

}  // namespace pscore::testing
