// PeerLinks: one dial per server address serves every caller, each within its own bound.
// The dials go to a listener whose accept queue is full, so the kernel drops their SYNs
// (as a cut link does) until the test makes room.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "comm/test_util.h"
#include "pscore/comm/event_loop.h"
#include "pscore/comm/messenger.h"
#include "pscore/node/common/peer_links.h"

#include <catch2/catch.hpp>  // last: its CHECK must win over glog's

namespace pscore::node {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A loopback listener that accepts nothing by itself; once its accept queue holds a
// connection, further SYNs are dropped. Accept() makes room for one more.
class FullListener {
 public:
  FullListener() {
    fd_ = comm::testing::ListenOnLoopback(0, &addr_);
    REQUIRE(fd_ >= 0);
    for (int i = 0; i < 4; ++i) {
      int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
      REQUIRE(fd >= 0);
      ::connect(fd, reinterpret_cast<sockaddr*>(&addr_), sizeof(addr_));  // EINPROGRESS, or dropped
      fillers_.push_back(fd);
    }
    std::this_thread::sleep_for(50ms);  // the first filler's handshake fills the queue
  }
  ~FullListener() {
    for (int fd : fillers_) ::close(fd);
    for (int fd : accepted_) ::close(fd);
    ::close(fd_);
  }
  int port() const { return ntohs(addr_.sin_port); }
  // Takes the queued connection and drops the other fillers: the next SYN is let in.
  void Accept() {
    int fd = ::accept(fd_, nullptr, nullptr);
    REQUIRE(fd >= 0);
    accepted_.push_back(fd);
    for (size_t i = 1; i < fillers_.size(); ++i) ::close(fillers_[i]);
    fillers_.resize(1);
  }

 private:
  int fd_ = -1;
  sockaddr_in addr_{};
  std::vector<int> fillers_;
  std::vector<int> accepted_;
};

// PeerLinks on a loop of its own, with server rank 0 at 127.0.0.1:port.
class Links {
 public:
  explicit Links(int port) : loop_("links") {
    options_.node_id = "w0";
    options_.role = pb::WORKER;
    options_.connect_timeout = 30s;
    REQUIRE(loop_.Start().ok());
    loop_.RunAndWait([this, port] {
      messenger_ = std::make_unique<comm::Messenger>(&loop_, comm::TransportOptions{}, comm::Messenger::Handlers{});
      links_ = std::make_unique<PeerLinks>(options_, &loop_, messenger_.get(), [] { return 0; });
      pb::SendMetadataMessage md;
      md.set_epoch(1);
      md.set_server_num(1);
      pb::ServersMeta* s = md.add_servers_meta();
      s->set_role(pb::SERVER);
      s->set_node_id("s0");
      s->set_rank_id(0);
      s->set_ip("127.0.0.1");
      s->set_port(port);
      s->set_is_alive(true);
      links_->Apply(md);
    });
  }
  ~Links() {
    loop_.RunAndWait([this] {
      links_->CancelTimers();
      messenger_->Shutdown();
    });
    loop_.Stop().IgnoreError();
  }
  // Asks for server 0's link with `bound`; the future gets the answer and when it came.
  std::future<std::pair<Result<comm::ConnId>, Clock::time_point>> Link(Duration bound) {
    auto p = std::make_shared<std::promise<std::pair<Result<comm::ConnId>, Clock::time_point>>>();
    auto f = p->get_future();
    loop_.Run([this, bound, p] {
      links_->Link(0, [p](Result<comm::ConnId> r) { p->set_value({std::move(r), Clock::now()}); }, bound);
    });
    return f;
  }

 private:
  NodeOptions options_;
  comm::EventLoop loop_;
  std::unique_ptr<comm::Messenger> messenger_;
  std::unique_ptr<PeerLinks> links_;
};

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

TEST_CASE("a caller that joins a longer dial gives up at its own bound - the dial goes on for the others",
          "[node][net][links]") {
  FullListener listener;
  Links links(listener.port());
  const auto t0 = Clock::now();
  auto slow = links.Link(20s);  // starts the dial, bounded 20 s
  auto fast = links.Link(400ms);
  REQUIRE(fast.wait_for(10s) == std::future_status::ready);
  auto [r, at] = fast.get();
  INFO(r.status());
  CHECK(r.status().code() == Code::kTimeout);
  CHECK(Ms(at - t0) >= 350);
  CHECK(Ms(at - t0) < 5000);  // not the dial's 20 s
  CHECK(slow.wait_for(0s) == std::future_status::timeout);
  // Room in the queue: the dial's next SYN gets through, and the first caller its link.
  listener.Accept();
  REQUIRE(slow.wait_for(15s) == std::future_status::ready);
  CHECK(slow.get().first.ok());
}

TEST_CASE("a dial that gives up at its caller's bound is made again for a caller with a longer one",
          "[node][net][links]") {
  FullListener listener;
  Links links(listener.port());
  const auto t0 = Clock::now();
  auto fast = links.Link(400ms);  // starts the dial, bounded 400 ms
  auto slow = links.Link(20s);
  REQUIRE(fast.wait_for(10s) == std::future_status::ready);
  auto [r, at] = fast.get();
  INFO(r.status());
  CHECK(r.status().code() == Code::kTimeout);
  CHECK(Ms(at - t0) < 5000);
  // The longer caller was not failed with the short dial: a new dial waits on for it.
  CHECK(slow.wait_for(300ms) == std::future_status::timeout);
  listener.Accept();
  REQUIRE(slow.wait_for(15s) == std::future_status::ready);
  auto [linked, when] = slow.get();
  INFO(linked.status());
  CHECK(linked.ok());
}

}  // namespace
}  // namespace pscore::node
