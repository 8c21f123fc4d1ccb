// Rank-table fan-out benchmark (scripts/bench.sh ranktable). A real SchedulerNode with its
// RankTableHub and HTTP endpoint runs on its own loop thread. Subscribers on real sockets:
// native RankTableSubscribers on one client loop thread, HTTP stream readers on one epoll
// thread. The job is one worker; once it registered (READY, the first table), the registrar
// registers it again at a new address per change (each changes the table: only complete
// tables are published). For each of 50 changes: time from just before the REGISTER is sent to the moment the last
// subscriber has received the new table (changes are sequential: the next starts once the
// last subscriber got the previous one). Prints the median and p90, and the scheduler loop
// thread's CPU time per change (CLOCK_THREAD_CPUTIME_ID, read on that thread).
// Cases: 256 native; 1,000 mixed (500 native + 500 HTTP).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "pscore/comm/messenger.h"
#include "pscore/core/cluster_manager.h"
#include "pscore/node/common/ranktable_subscriber.h"
#include "pscore/node/common/wire.h"
#include "pscore/node/scheduler/ranktable_hub.h"
#include "pscore/node/scheduler/scheduler_http.h"
#include "pscore/node/scheduler/scheduler_node.h"

#include "bench/bench_util.h"

namespace pscore::node {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr int kChanges = 50;

int64_t NowNs() { return Clock::now().time_since_epoch().count(); }

int64_t ThreadCpuNs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

// Counts tables received by every subscriber; the one that completes a round stamps the time.
struct Tally {
  std::atomic<uint64_t> received{0};
  std::atomic<uint64_t> target{0};
  std::atomic<int64_t> done_ns{0};
  void Add(uint64_t n) {
    uint64_t now = received.fetch_add(n) + n;
    if (now == target.load()) done_ns.store(NowNs());
  }
};

int ConnectHttp(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  std::string req = "GET /v1/ranktable/stream?jobId=default&role=worker HTTP/1.1\r\nHost: b\r\n\r\n";
  if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// HTTP stream readers on one epoll thread. A table line ends with "}\n" (chunk framing only
// has "\r\n"), so counting "}\n" counts tables; the last byte carries across reads.
class HttpReaders {
 public:
  HttpReaders(int port, int n, Tally* tally) : tally_(tally) {
    ep_ = epoll_create1(0);
    for (int i = 0; i < n; ++i) {
      int fd = ConnectHttp(port);
      if (fd < 0) continue;
      fds_.push_back(fd);
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u32 = static_cast<uint32_t>(fds_.size() - 1);
      epoll_ctl(ep_, EPOLL_CTL_ADD, fd, &ev);
    }
    last_.assign(fds_.size(), 0);
    thread_ = std::thread([this] { Run(); });
  }
  ~HttpReaders() {
    stop_ = true;
    thread_.join();
    for (int fd : fds_) ::close(fd);
    ::close(ep_);
  }
  size_t size() const { return fds_.size(); }

 private:
  void Run() {
    std::vector<epoll_event> evs(256);
    std::vector<char> buf(1 << 20);
    while (!stop_) {
      int n = epoll_wait(ep_, evs.data(), static_cast<int>(evs.size()), 50);
      for (int i = 0; i < n; ++i) {
        uint32_t idx = evs[i].data.u32;
        ssize_t r = ::recv(fds_[idx], buf.data(), buf.size(), MSG_DONTWAIT);
        if (r <= 0) continue;
        uint64_t lines = 0;
        char prev = last_[idx];
        for (ssize_t k = 0; k < r; ++k) {
          if (buf[k] == '\n' && prev == '}') ++lines;
          prev = buf[k];
        }
        last_[idx] = prev;
        if (lines) tally_->Add(lines);
      }
    }
  }
  Tally* tally_;
  int ep_;
  std::vector<int> fds_;
  std::vector<char> last_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
};

struct Figures {
  double median_us = 0, p90_us = 0, cpu_us_per_change = 0;
  int subscribers = 0;
};

// bench-w's REGISTER; change c >= 0 gives it address 10.9.0.c (a retry that moves it), -1
// the first address.
BufferPtr Registration(int c) {
  pb::RegisterMessage msg;
  msg.set_ip(c < 0 ? "127.0.0.1" : "10.9." + std::to_string(c / 256) + "." + std::to_string(c % 256));
  msg.set_port(2000);
  msg.set_node_id("bench-w");
  msg.set_role(pb::WORKER);
  msg.set_incarnation(1);
  msg.set_protocol_version(node::kProtocolVersion);
  msg.set_requested_rank(-1);
  pb::Device* d = msg.add_devices();
  d->set_local_id(0);
  d->set_device_ip("10.0.0.1");
  return ToBuffer(msg);
}

Figures RunCase(int native, int http) {
  SchedulerOptions so;
  so.worker_num = 1;  // READY once bench-w registers; each change moves it to a new address
  so.server_num = 0;
  so.heartbeat_interval = 1s;
  so.heartbeat_timeout = 600s;
  SchedulerNode sched(so);
  if (!sched.Start().ok()) std::abort();
  RankTableHub hub(&sched);
  if (!hub.Start().ok()) std::abort();
  SchedulerHttp web(&sched, &hub);
  pscore::Result<int> http_port = web.Start("127.0.0.1", 0);
  if (!http_port.ok()) std::abort();

  Tally tally;
  comm::EventLoop client_loop("subs");
  if (!client_loop.Start().ok()) std::abort();
  std::vector<std::unique_ptr<RankTableSubscriber>> subs;
  RankTableSubscriberOptions o;
  o.port = sched.port();
  for (int i = 0; i < native; ++i) {
    subs.push_back(std::make_unique<RankTableSubscriber>(o, [&tally](const pb::RankTableStream&) { tally.Add(1); },
                                                         nullptr, &client_loop));
    if (!subs.back()->Start().ok()) std::abort();
  }
  HttpReaders readers(*http_port, http, &tally);
  comm::EventLoop reg_loop("registrar");
  if (!reg_loop.Start().ok()) std::abort();
  comm::Messenger reg(&reg_loop, comm::TransportOptions(), comm::Messenger::Handlers());
  std::promise<comm::ConnId> connected;
  reg_loop.Post([&] {
    reg.transport().Connect("127.0.0.1", sched.port(), comm::ConnectOptions(),
                            [&](pscore::Result<comm::ConnId> c) { connected.set_value(c.ok() ? *c : 0); });
  });
  comm::ConnId conn = connected.get_future().get();

  const uint64_t total = static_cast<uint64_t>(native) + readers.size();
  // The job's one worker registers: READY, the initial table. Wait until everybody holds it.
  tally.target.store(total);
  tally.done_ns.store(0);
  reg_loop.Post([&, payload = Registration(-1)] {
    reg.Call(conn, MakeMeta(pb::REGISTER, pb::WORKER, 0), payload, 10s, [](pscore::Result<comm::Frame>) {});
  });
  for (int i = 0; i < 2000 && tally.received.load() < total; ++i) std::this_thread::sleep_for(5ms);
  if (tally.received.load() != total) {
    std::fprintf(stderr, "only %lu of %lu subscribers got the initial table\n",
                 static_cast<unsigned long>(tally.received.load()), static_cast<unsigned long>(total));
    std::abort();
  }

  auto cpu = [&] {
    std::promise<int64_t> p;
    sched.loop()->Post([&] { p.set_value(ThreadCpuNs()); });
    return p.get_future().get();
  };
  std::vector<double> lat;
  int64_t cpu0 = cpu();
  for (int c = 0; c < kChanges; ++c) {
    BufferPtr payload = Registration(c);
    tally.target.store(total * (c + 2));
    tally.done_ns.store(0);
    int64_t t0 = NowNs();
    reg_loop.Post([&, payload] {
      reg.Call(conn, MakeMeta(pb::REGISTER, pb::WORKER, 0), payload, 10s, [](pscore::Result<comm::Frame>) {});
    });
    auto deadline = Clock::now() + 10s;
    while (tally.done_ns.load() == 0 && Clock::now() < deadline) std::this_thread::yield();
    if (tally.done_ns.load() == 0) {
      std::fprintf(stderr, "change %d: not every subscriber got it within 10 s\n", c);
      std::abort();
    }
    lat.push_back((tally.done_ns.load() - t0) / 1000.0);
  }
  int64_t cpu1 = cpu();
  Figures r;
  r.median_us = bench::Quantile(&lat, 0.5);
  r.p90_us = bench::Quantile(&lat, 0.9);
  r.cpu_us_per_change = (cpu1 - cpu0) / 1000.0 / kChanges;
  r.subscribers = static_cast<int>(total);

  reg_loop.Post([&] { reg.Shutdown(); });
  subs.clear();
  client_loop.Stop().IgnoreError();
  reg_loop.Stop().IgnoreError();
  web.Stop();
  hub.Stop();
  sched.Stop();
  return r;
}

void Print(const char* name, const Figures& r, double target_us) {
  std::printf("ranktable_%s_subscribers %d count\n", name, r.subscribers);
  std::printf("ranktable_%s_last_median %.0f us\n", name, r.median_us);
  std::printf("ranktable_%s_last_p90 %.0f us\n", name, r.p90_us);
  std::printf("ranktable_%s_scheduler_cpu_per_change %.0f us\n", name, r.cpu_us_per_change);
  std::printf("ranktable_%s_median_vs_target %.2f ratio (target %.0f us; <= 1 meets it)\n", name,
              r.median_us / target_us, target_us);
}

}  // namespace
}  // namespace pscore::node

int main(int argc, char** argv) {
  google::InitGoogleLogging(argv[0]);
  FLAGS_minloglevel = 2;  // keep the per-version INFO lines out of the figures
  using pscore::node::RunCase;
  std::string only = argc > 1 ? argv[1] : "";
  if (only == "smoke") {  // CI: both kinds of subscriber, a handful of each
    pscore::node::Print("smoke8", RunCase(4, 4), 2000);
    return 0;
  }
  if (only.empty() || only == "native") pscore::node::Print("native256", RunCase(256, 0), 2000);
  if (only.empty() || only == "mixed") pscore::node::Print("mixed1000", RunCase(500, 500), 10000);
  return 0;
}
