// Transport benchmark on loopback: one-way throughput per payload size and 64 B request/
// response rates through pscore's Transport/Messenger, each beside a plain blocking-socket
// baseline measured in the same run. Prints one line per figure: `name value unit`.
// Run through scripts/bench.sh transport (Release build).
// `transport_bench tls` (scripts/bench.sh transport --tls): the same pscore figures with
// TLS 1.3 (test certificates made at start) against plaintext in the same run, and the
// rate of TLS handshakes on one listener when 1,000 connections are dialled at once.

#include <glog/logging.h>
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <future>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "pscore/comm/event_loop.h"
#include "pscore/comm/messenger.h"
#include "pscore/comm/tls.h"
#include "pscore/comm/transport.h"
#include "bench/bench_util.h"
#include "bench/blocking_baseline.h"
#include "comm/tls_pki.h"

namespace pscore::comm {
namespace {

using Clock = std::chrono::steady_clock;
using bench::Print;
using bench::Quantile;
using bench::Seconds;
using bench::SizeName;
using bench::Wait;
using bench::ConnectedPair;
using bench::RecvMessage;
using bench::SendMessage;
using bench::SocketPair;

// Messages sent for a payload size: 1 GiB in total, at most 1M messages (smoke: 1/64 of both).
int g_volume_shift = 0;
uint64_t MessageCount(size_t size) {
  return std::min<uint64_t>(((1ull << 30) >> g_volume_shift) / size, 1000000 >> g_volume_shift);
}

template <typename F>
auto OnLoop(EventLoop& loop, F fn) -> decltype(fn()) {
  using R = decltype(fn());
  auto p = std::make_shared<std::promise<R>>();
  auto f = p->get_future();
  loop.Post([p, fn]() mutable {
    if constexpr (std::is_void_v<R>) {
      fn();
      p->set_value();
    } else {
      p->set_value(fn());
    }
  });
  return Wait(f);
}

// ---- pscore one-way throughput ----

// Receiver: counts payload bytes and acknowledges every quarter window so the sender
// keeps at most `window` bytes in flight.
// TLS contexts of the receiver/server and the sender/client (null: plaintext).
struct Tls {
  std::shared_ptr<TlsContext> server, client;
};
TransportOptions Options(const std::shared_ptr<TlsContext>& tls) {
  TransportOptions o;
  o.tls = tls;
  return o;
}

double PscoreThroughput(size_t size, const Tls& tls = {}) {
  const uint64_t count = MessageCount(size);
  const uint64_t window = std::max<uint64_t>(2ull << 20, 4 * size);
  EventLoop rloop("recv"), sloop("send");
  std::promise<Clock::time_point> finished;
  uint64_t got_msgs = 0, got_bytes = 0, acked_bytes = 0;  // receiver loop only
  std::unique_ptr<Transport> receiver;
  Transport::Handlers rh;
  rh.on_frame = [&](ConnId c, Frame&& f) {
    ++got_msgs;
    got_bytes += f.payload ? f.payload->size() : 0;
    if (got_bytes - acked_bytes >= window / 4 || got_msgs == count) {
      acked_bytes = got_bytes;
      pb::MessageMeta ack;
      ack.set_request_id(got_bytes);
      receiver->Send(c, ack, nullptr).IgnoreError();
    }
    if (got_msgs == count) finished.set_value(Clock::now());
  };
  receiver = std::make_unique<Transport>(&rloop, Options(tls.server), std::move(rh));

  // Sender state, sender loop only.
  std::unique_ptr<Transport> sender;
  ConnId conn = kNoConn;
  BufferPtr payload = Buffer::Allocate(size);
  std::memset(payload->data(), 'p', size);
  uint64_t sent = 0, sent_bytes = 0, peer_acked = 0;
  pb::MessageMeta meta;
  meta.set_cmd(pb::SEND_DATA);
  auto pump = [&] {
    while (sent < count && sent_bytes - peer_acked < window) {
      meta.set_request_id(sent);
      sender->Send(conn, meta, payload).IgnoreError();
      ++sent;
      sent_bytes += size;
    }
  };
  Transport::Handlers sh;
  sh.on_frame = [&](ConnId, Frame&& f) {
    peer_acked = f.meta.request_id();
    pump();
  };
  sender = std::make_unique<Transport>(&sloop, Options(tls.client), std::move(sh));
  CHECK(rloop.Start().ok());
  CHECK(sloop.Start().ok());
  int port = *OnLoop(rloop, [&] { return receiver->Listen("127.0.0.1", 0); });
  std::promise<Result<ConnId>> connected;
  sloop.Post([&] {
    sender->Connect("127.0.0.1", port, ConnectOptions(),
                    [&](Result<ConnId> r) { connected.set_value(std::move(r)); });
  });
  auto cf = connected.get_future();
  conn = *Wait(cf);
  Clock::time_point start = Clock::now();
  sloop.Post(pump);
  auto ff = finished.get_future();
  Clock::time_point end = Wait(ff);
  CHECK(sloop.Stop().ok());
  CHECK(rloop.Stop().ok());
  return static_cast<double>(count * size) / Seconds(end - start) / 1e6;
}

// ---- blocking-socket baseline (tests/bench/blocking_baseline.h) ----

double BaselineThroughput(size_t size) {
  const uint64_t count = MessageCount(size);
  SocketPair p = ConnectedPair();
  std::vector<char> payload(size, 'p');
  Clock::time_point start = Clock::now();
  std::thread sender([&] {
    for (uint64_t i = 0; i < count; ++i) SendMessage(p.client, payload.data(), size);
  });
  std::vector<char> buf;
  uint64_t bytes = 0;
  for (uint64_t i = 0; i < count; ++i) bytes += RecvMessage(p.server, &buf);
  Clock::time_point end = Clock::now();
  sender.join();
  p.Close();
  return static_cast<double>(bytes) / Seconds(end - start) / 1e6;
}

// ---- request/response ----

// Rate of 64 B echo round trips through Messenger with `depth` requests in flight.
// Round trips per second through Messenger::Call against an echo server, `depth` in
// flight. With `rtts_us`, each call's round trip (issue to answer, microseconds) is
// recorded there too (meaningful at depth 1).
double PscoreRoundTrips(uint64_t total, int depth, const Tls& tls = {}, std::vector<double>* rtts_us = nullptr) {
  EventLoop sloop("echo-server"), cloop("echo-client");
  std::unique_ptr<Messenger> server;
  Messenger::Handlers sh;
  sh.on_request = [&](ConnId c, Frame&& f) {
    server->Reply(c, f.meta, Status::Ok(), std::move(f.payload)).IgnoreError();
  };
  server = std::make_unique<Messenger>(&sloop, Options(tls.server), std::move(sh));
  auto client = std::make_unique<Messenger>(&cloop, Options(tls.client), Messenger::Handlers());
  CHECK(sloop.Start().ok());
  CHECK(cloop.Start().ok());
  int port = *OnLoop(sloop, [&] { return server->transport().Listen("127.0.0.1", 0); });
  std::promise<Result<ConnId>> connected;
  cloop.Post([&] {
    client->transport().Connect("127.0.0.1", port, ConnectOptions(),
                                [&](Result<ConnId> r) { connected.set_value(std::move(r)); });
  });
  auto cf = connected.get_future();
  ConnId conn = *Wait(cf);

  BufferPtr payload = Buffer::Allocate(64);
  std::memset(payload->data(), 'r', 64);
  uint64_t issued = 0, answered = 0;  // client loop only
  std::promise<Clock::time_point> finished;
  if (rtts_us != nullptr) rtts_us->reserve(rtts_us->size() + total);
  std::function<void()> issue = [&] {
    ++issued;
    pb::MessageMeta meta;
    meta.set_cmd(pb::SEND_DATA);
    const Clock::time_point sent = rtts_us != nullptr ? Clock::now() : Clock::time_point();
    client->Call(conn, meta, payload, std::chrono::seconds(30), [&, sent](Result<Frame> r) {
      CHECK(r.ok()) << r.status();
      if (rtts_us != nullptr) rtts_us->push_back(Seconds(Clock::now() - sent) * 1e6);
      if (++answered == total) finished.set_value(Clock::now());
      if (issued < total) issue();
    });
  };
  Clock::time_point start = Clock::now();
  cloop.Post([&] {
    for (int i = 0; i < depth && issued < total; ++i) issue();
  });
  auto ff = finished.get_future();
  Clock::time_point end = Wait(ff);
  CHECK(cloop.Stop().ok());
  CHECK(sloop.Stop().ok());
  client.reset();
  server.reset();
  return static_cast<double>(total) / Seconds(end - start);
}

double BaselineRoundTrips(uint64_t total) {
  SocketPair p = ConnectedPair();
  std::thread echo([&] {
    std::vector<char> buf;
    for (uint64_t i = 0; i < total; ++i) {
      uint64_t n = RecvMessage(p.server, &buf);
      SendMessage(p.server, buf.data(), n);
    }
  });
  std::vector<char> payload(64, 'r'), buf;
  Clock::time_point start = Clock::now();
  for (uint64_t i = 0; i < total; ++i) {
    SendMessage(p.client, payload.data(), payload.size());
    CHECK_EQ(RecvMessage(p.client, &buf), payload.size());
  }
  Clock::time_point end = Clock::now();
  echo.join();
  p.Close();
  return static_cast<double>(total) / Seconds(end - start);
}

// Completed TLS handshakes per second on one listener when `n` connections are dialled at
// once from another loop (both loops on this machine: the figure counts both sides' work).
double TlsHandshakes(const Tls& tls, int n) {
  EventLoop sloop("tls-server"), cloop("tls-client");
  TransportOptions so = Options(tls.server);
  so.tls_handshake_timeout = std::chrono::seconds(60);
  so.first_frame_timeout = Duration::zero();
  auto server = std::make_unique<Transport>(&sloop, so, Transport::Handlers());
  TransportOptions co = Options(tls.client);
  co.tls_handshake_timeout = std::chrono::seconds(60);
  auto client = std::make_unique<Transport>(&cloop, co, Transport::Handlers());
  CHECK(sloop.Start().ok());
  CHECK(cloop.Start().ok());
  int port = *OnLoop(sloop, [&] { return server->Listen("127.0.0.1", 0); });
  std::promise<Clock::time_point> finished;
  int done = 0, failed = 0;  // client loop only
  Clock::time_point start = Clock::now();
  cloop.Post([&] {
    ConnectOptions opts;
    opts.timeout = std::chrono::seconds(60);
    for (int i = 0; i < n; ++i) {
      client->Connect("127.0.0.1", port, opts, [&](Result<ConnId> r) {
        if (!r.ok()) ++failed;
        if (++done == n) finished.set_value(Clock::now());
      });
    }
  });
  auto ff = finished.get_future();
  Clock::time_point end = Wait(ff);
  CHECK_EQ(failed, 0);
  CHECK(cloop.Stop().ok());
  CHECK(sloop.Stop().ok());
  client.reset();
  server.reset();
  return n / Seconds(end - start);
}

// CPU seconds (user and system, all threads) this process has used.
double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto s = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6; };
  return s(u.ru_utime) + s(u.ru_stime);
}

// One-way throughput (MB/s) and the CPU time both loops spent per byte (ns/B).
std::pair<double, double> ThroughputAndCpu(size_t size, const Tls& tls = {}) {
  const double cpu0 = CpuSeconds();
  const double mbps = PscoreThroughput(size, tls);
  const double cpu = CpuSeconds() - cpu0;
  return {mbps, cpu * 1e9 / static_cast<double>(MessageCount(size) * size)};
}

// TLS one-way throughput only, one run per size (for a profiler).
int MainTlsOneway() {
  testing::TestPki pki;
  Tls tls{pki.Context("server", "scheduler"), pki.Context("client", "worker-0")};
  for (size_t size : {size_t{64} << 10, size_t{1} << 20, size_t{16} << 20}) {
    auto [mbps, cpu] = ThroughputAndCpu(size, tls);
    Print("oneway_" + SizeName(size) + "_tls", mbps, "MB/s");
    Print("oneway_" + SizeName(size) + "_tls_cpu", cpu, "ns/B", 3);
  }
  return 0;
}

// TLS against plaintext, pscore both times, interleaved (best of reps).
int MainTls(bool smoke) {
  testing::TestPki pki;
  Tls tls{pki.Context("server", "scheduler"), pki.Context("client", "worker-0")};
  std::vector<size_t> sizes = {64 << 10, 1 << 20, 16 << 20};
  if (smoke) sizes = {64 << 10};
  const int reps = smoke ? 1 : 3;  // kReps, defined below
  std::printf("# pscore transport with TLS 1.3 against plaintext (loopback; MB = 1e6 bytes; best of %d)\n", reps);
  for (size_t size : sizes) {
    std::string n = SizeName(size);
    double plain = 0, with_tls = 0, plain_cpu = 1e30, tls_cpu = 1e30;
    for (int i = 0; i < reps; ++i) {
      auto [p, pc] = ThroughputAndCpu(size);
      auto [t, tc] = ThroughputAndCpu(size, tls);
      plain = std::max(plain, p);
      with_tls = std::max(with_tls, t);
      plain_cpu = std::min(plain_cpu, pc);
      tls_cpu = std::min(tls_cpu, tc);
    }
    Print("oneway_" + n + "_plain", plain, "MB/s");
    Print("oneway_" + n + "_tls", with_tls, "MB/s");
    Print("oneway_" + n + "_tls_ratio", with_tls / plain, "x");
    // CPU time of both loops per byte moved (less sensitive than MB/s to other load).
    Print("oneway_" + n + "_plain_cpu", plain_cpu, "ns/B", 3);
    Print("oneway_" + n + "_tls_cpu", tls_cpu, "ns/B", 3);
  }
  const uint64_t trips = smoke ? 2000 : 50000;
  double plain_rtt = 0, tls_rtt = 0;
  double plain_p50 = std::numeric_limits<double>::infinity(), tls_p50 = plain_p50;
  for (int i = 0; i < reps; ++i) {
    std::vector<double> plain_us, tls_us;
    plain_rtt = std::max(plain_rtt, PscoreRoundTrips(trips, 1, {}, &plain_us));
    tls_rtt = std::max(tls_rtt, PscoreRoundTrips(trips, 1, tls, &tls_us));
    plain_p50 = std::min(plain_p50, Quantile(&plain_us, 0.5));
    tls_p50 = std::min(tls_p50, Quantile(&tls_us, 0.5));
  }
  Print("rtt_64B_depth1_plain", plain_rtt, "req/s");
  Print("rtt_64B_depth1_tls", tls_rtt, "req/s");
  // Round trips per second at depth 1: the mean round trip of TLS over plaintext's.
  Print("rtt_64B_depth1_tls_time_ratio", plain_rtt / tls_rtt, "x");
  // The median round trip of each (the lowest of the runs' medians), and TLS over plaintext.
  Print("rtt_64B_depth1_plain_p50", plain_p50, "us", 2);
  Print("rtt_64B_depth1_tls_p50", tls_p50, "us", 2);
  Print("rtt_64B_depth1_tls_p50_ratio", tls_p50 / plain_p50, "x");
  const int conns = smoke ? 50 : 1000;
  Print("tls_handshakes_" + std::to_string(conns) + "_at_once", TlsHandshakes(tls, conns), "handshakes/s");
  return 0;
}

// Best of kReps runs, pscore and baseline interleaved, so a burst of load from other
// processes on the machine does not decide a ratio.
constexpr int kReps = 3;

// only: "" runs everything, "oneway" or "rtt" one group (handy under a profiler), "smoke"
// every figure at the two smallest sizes with one rep and few round trips (CI: it runs);
// "tls" / "tls-smoke" TLS against plaintext, "tls-oneway" the TLS one-way figures alone.
int Main(std::string only) {
  if (only == "tls" || only == "--tls") return MainTls(false);
  if (only == "tls-smoke") return MainTls(true);
  if (only == "tls-oneway") return MainTlsOneway();
  const bool smoke = only == "smoke";
  if (smoke) only.clear();
  std::vector<size_t> sizes = {64, 4 << 10, 64 << 10, 1 << 20, 16 << 20};
  if (smoke) sizes.resize(2);
  if (smoke) g_volume_shift = 6;
  const int reps = smoke ? 1 : kReps;
  std::printf("# pscore transport benchmark (loopback; MB = 1e6 bytes; best of %d)\n", reps);
  for (size_t size : sizes) {
    if (!only.empty() && only != "oneway") break;
    std::string n = SizeName(size);
    double base = 0, ps = 0;
    for (int i = 0; i < reps; ++i) {
      base = std::max(base, BaselineThroughput(size));
      ps = std::max(ps, PscoreThroughput(size));
    }
    Print("oneway_" + n + "_baseline", base, "MB/s");
    Print("oneway_" + n + "_pscore", ps, "MB/s");
    Print("oneway_" + n + "_ratio", ps / base, "x");
  }
  if (!only.empty() && only != "rtt") return 0;
  const uint64_t kRoundTrips = smoke ? 2000 : 50000;
  double base_rtt = 0, ps_rtt = 0, ps_rtt64 = 0;
  for (int i = 0; i < reps; ++i) {
    base_rtt = std::max(base_rtt, BaselineRoundTrips(kRoundTrips));
    ps_rtt = std::max(ps_rtt, PscoreRoundTrips(kRoundTrips, 1));
    ps_rtt64 = std::max(ps_rtt64, PscoreRoundTrips(4 * kRoundTrips, 64));
  }
  Print("rtt_64B_depth1_baseline", base_rtt, "req/s");
  Print("rtt_64B_depth1_pscore", ps_rtt, "req/s");
  Print("rtt_64B_depth1_ratio", ps_rtt / base_rtt, "x");
  Print("rtt_64B_depth64_pscore", ps_rtt64, "req/s");
  Print("rtt_64B_depth64_vs_depth1_baseline", ps_rtt64 / base_rtt, "x");
  return 0;
}

}  // namespace
}  // namespace pscore::comm

int main(int argc, char** argv) {
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = 1;
  return pscore::comm::Main(argc > 1 ? argv[1] : "");
}
