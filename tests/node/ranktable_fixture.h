// Helpers for the rank-table and HTTP tests: a scheduler with its rank-table hub (and
// optionally its HTTP endpoint), a capture of WARNING lines, a light "registrar" that
// registers fake nodes over the native protocol, and a thread-safe collector of received
// tables. Include after the project headers and before nothing else of Catch (it pulls
// in comm/test_util.h).
#pragma once

#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include <glog/logging.h>
#include <nlohmann/json.hpp>

#include "pscore/comm/messenger.h"
#include "pscore/node/common/wire.h"
#include "pscore/node/scheduler/ranktable_hub.h"
#include "pscore/node/scheduler/scheduler_node.h"

#include "comm/test_util.h"  // last: Catch's CHECK wins over glog's

namespace pscore::testing {

using namespace std::chrono_literals;
using comm::testing::Await;
using comm::testing::OnLoop;

// Records the WARNING-and-above lines logged while it is installed (any thread logs).
class WarningCapture : public google::LogSink {
 public:
  WarningCapture() { google::AddLogSink(this); }
  ~WarningCapture() override { google::RemoveLogSink(this); }
  using google::LogSink::send;
  void send(google::LogSeverity severity, const char*, const char*, int, const google::LogMessageTime&,
            const char* message, size_t message_len) override {
    if (severity < google::GLOG_WARNING) return;
    std::lock_guard<std::mutex> lock(mu_);
    lines_.emplace_back(message, message_len);
  }
  // The captured lines containing `text`.
  std::vector<std::string> Matching(const std::string& text) const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> out;
    for (const std::string& l : lines_) {
      if (l.find(text) != std::string::npos) out.push_back(l);
    }
    return out;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::string> lines_;
};

// Registers fake nodes (no heartbeats) from a loop of its own.
class Registrar {
 public:
  explicit Registrar(int sched_port) : loop_("registrar"), port_(sched_port) {
    messenger_ = std::make_unique<comm::Messenger>(&loop_, comm::TransportOptions(), comm::Messenger::Handlers());
    REQUIRE(loop_.Start().ok());
    auto p = std::make_shared<std::promise<Result<comm::ConnId>>>();
    auto f = p->get_future();
    loop_.Post([this, p] {
      messenger_->transport().Connect("127.0.0.1", port_, comm::ConnectOptions(),
                                      [p](Result<comm::ConnId> c) { p->set_value(std::move(c)); });
    });
    Result<comm::ConnId> c = Await(f);
    REQUIRE(c.ok());
    conn_ = *c;
  }
  ~Registrar() {
    loop_.Stop().IgnoreError();
    messenger_.reset();
  }
  // devices: how many devices the node reports (each with a long device_ip, to grow the table).
  // ip: the node's address (a retry with another one republishes the membership).
  Status Register(const std::string& node_id, pb::NodeRole role, int devices = 1, uint64_t incarnation = 1,
                  const std::string& ip = "127.0.0.1") {
    pb::RegisterMessage msg;
    msg.set_ip(ip);
    msg.set_port(1000);
    msg.set_node_id(node_id);
    msg.set_role(role);
    msg.set_incarnation(incarnation);
    msg.set_protocol_version(node::kProtocolVersion);
    msg.set_requested_rank(-1);
    msg.set_host_name("host-" + node_id);
    for (int d = 0; d < devices; ++d) {
      pb::Device* dev = msg.add_devices();
      dev->set_local_id(d);
      dev->set_device_ip("10.20." + std::to_string(d) + "." + std::to_string(d + 1));
    }
    auto p = std::make_shared<std::promise<Status>>();
    auto f = p->get_future();
    loop_.Post([this, p, payload = node::ToBuffer(msg)] {
      messenger_->Call(conn_, node::MakeMeta(pb::REGISTER, pb::WORKER, 0), payload, 10s,
                       [p](Result<comm::Frame> r) { p->set_value(r.status()); });
    });
    return Await(f);
  }

 private:
  comm::EventLoop loop_;
  int port_;
  std::unique_ptr<comm::Messenger> messenger_;
  comm::ConnId conn_ = comm::kNoConn;
};

// Tables received by one subscriber, in order; any thread adds, the test thread waits.
class Collector {
 public:
  void Add(std::string table) {
    std::lock_guard<std::mutex> lock(mu_);
    tables_.push_back(std::move(table));
    cv_.notify_all();
  }
  // Waits until a received table satisfies pred; false after the deadline.
  template <typename Pred>
  bool WaitFor(Pred pred, std::chrono::milliseconds timeout = 20s) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return !tables_.empty() && pred(tables_.back()); });
  }
  // Waits until some table received after the first `from` satisfies pred (not only the
  // newest: a later change may already have replaced it); false after the deadline.
  template <typename Pred>
  bool WaitForAnySince(size_t from, Pred pred, std::chrono::milliseconds timeout = 20s) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] {
      for (size_t i = from; i < tables_.size(); ++i) {
        if (pred(tables_[i])) return true;
      }
      return false;
    });
  }
  bool WaitForTable(const std::string& table, std::chrono::milliseconds timeout = 20s) {
    return WaitFor([&](const std::string& t) { return t == table; }, timeout);
  }
  std::vector<std::string> tables() const {
    std::lock_guard<std::mutex> lock(mu_);
    return tables_;
  }
  size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return tables_.size();
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> tables_;
};

// Number of hosts in the worker group of a rank-table JSON text (-1 if unparsable).
inline int WorkerHosts(const std::string& table) {
  nlohmann::json j = nlohmann::json::parse(table, nullptr, false);
  if (j.is_discarded()) return -1;
  return static_cast<int>(j["server_group_list"][0]["server_list"].size());
}

// Number of hosts (both groups) whose server_ip is not 127.0.0.1 (-1 if unparsable).
inline int MovedHosts(const std::string& table) {
  nlohmann::json j = nlohmann::json::parse(table, nullptr, false);
  if (j.is_discarded()) return -1;
  int n = 0;
  for (const nlohmann::json& g : j["server_group_list"]) {
    for (const nlohmann::json& s : g["server_list"]) n += s["server_ip"] != "127.0.0.1";
  }
  return n;
}

inline std::string TableStatus(const std::string& table) {
  nlohmann::json j = nlohmann::json::parse(table, nullptr, false);
  return j.is_discarded() ? "" : j["status"].get<std::string>();
}

inline node::SchedulerOptions SchedOpts(int workers, int servers, std::string job = "job-7") {
  node::SchedulerOptions o;
  o.worker_num = workers;
  o.server_num = servers;
  o.heartbeat_interval = 50ms;
  o.heartbeat_timeout = 60s;
  o.job_id = std::move(job);
  return o;
}

// The hub's current table text, read on the loop.
inline std::string CurrentTable(node::SchedulerNode& sched, node::RankTableHub& hub) {
  return OnLoop(*sched.loop(), [&] { return hub.current() ? hub.current()->table : std::string(); });
}

}  // namespace pscore::testing
