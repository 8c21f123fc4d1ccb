// Hostile peers against a real job (pscore-node scheduler with HTTP, one server, one
// worker): every port (scheduler, server data port, scheduler HTTP) gets random bytes, a
// valid header with absurd lengths, a half frame then silence, and 2000 connections that
// never speak; raw clients send commands of the wrong role (SCALE_OUT to the scheduler,
// SEND_DATA to a server without registering). Each is closed or refused with a reason (in
// the peer's log, and as a close or an error answer at the client); the job keeps its
// state (READY, same epoch) and the scheduler's RSS stays under a ceiling. Children are
// SIGKILLed by pid at the end.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "pscore/comm/frame.h"
#include "pscore/core/kv_codec.h"
#include "pscore/node/common/admin_client.h"
#include "pscore/node/common/wire.h"
#include "pscore/node/server/server_node.h"
#include "pscore/proto/comm.pb.h"
#include "multiproc/process.h"
#include "multiproc/raw_conn.h"

#include <catch2/catch.hpp>  // last: its CHECK must win over glog's

namespace pscore::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr int kSilentConnections = 2000;
constexpr int64_t kRssCeilingKb = 200 * 1024;

// A blocking client socket owned by the test (closed at destruction).
std::string Frame(const pb::MessageMeta& meta, const std::string& payload) {
  std::string m = meta.SerializeAsString();
  comm::FrameHeader h;
  h.meta_len = static_cast<uint32_t>(m.size());
  h.data_len = payload.size();
  return comm::EncodeHeader(h) + m + payload;
}

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string out(n, '\0');
  for (char& c : out) c = static_cast<char>(rng());
  return out;
}

int64_t RssKb(pid_t pid) { return StatusKb(pid, "VmRSS:"); }

class Job {
 public:
  // `extra` flags go to every process.
  explicit Job(const std::vector<std::string>& extra = {}) {
    REQUIRE(dir_.ok());
    std::vector<std::string> timing = {"--heartbeat_interval_ms=100", "--heartbeat_timeout_ms=3000"};
    timing.insert(timing.end(), extra.begin(), extra.end());
    std::vector<std::string> argv = {NodeBinary(), "--role=scheduler", "--scheduler_port=0", "--worker_num=1",
                                     "--server_num=1", "--http_port=0", "--port_file=" + dir_.File("sched.port"),
                                     "--http_port_file=" + dir_.File("http.port")};
    argv.insert(argv.end(), timing.begin(), timing.end());
    REQUIRE(scheduler_.Start(argv, dir_.File("scheduler.log")));
    sched_port_ = ReadPortFile(dir_.File("sched.port"), 10s);
    http_port_ = ReadPortFile(dir_.File("http.port"), 10s);
    REQUIRE(sched_port_ > 0);
    REQUIRE(http_port_ > 0);
    for (std::string role : {"server", "worker"}) {
      std::vector<std::string> a = {NodeBinary(), "--role=" + role, "--node_id=" + role.substr(0, 1) + "0",
                                    "--scheduler_port=" + std::to_string(sched_port_), "--auto_finish=false",
                                    "--port_file=" + dir_.File(role + ".port")};
      a.insert(a.end(), timing.begin(), timing.end());
      REQUIRE((role == "server" ? server_ : worker_).Start(a, dir_.File(role + ".log")));
    }
    server_port_ = ReadPortFile(dir_.File("server.port"), 10s);
    REQUIRE(server_port_ > 0);
    node::AdminClientOptions o;
    o.scheduler_port = sched_port_;
    o.timeout = 5s;
    admin_ = std::make_unique<node::AdminClient>(o);
    REQUIRE(admin_->Connect().ok());
    Result<pb::AdminResponse> ready = admin_->WaitForReady(15s);
    REQUIRE(ready.ok());
    epoch_ = ready->epoch();
  }

  // The job is READY with the epoch it had, and every process runs.
  void CheckIntact() {
    Result<pb::AdminResponse> st = admin_->Admin("status");
    REQUIRE(st.ok());
    CHECK(st->cluster_state() == pb::CLUSTER_READY);
    CHECK(st->epoch() == epoch_);
    CHECK(scheduler_.running());
    CHECK(server_.running());
    CHECK(worker_.running());
  }

  Process& scheduler() { return scheduler_; }
  Process& server() { return server_; }
  int sched_port() const { return sched_port_; }
  int server_port() const { return server_port_; }
  int http_port() const { return http_port_; }

 private:
  TempDir dir_;
  Process scheduler_, server_, worker_;
  std::unique_ptr<node::AdminClient> admin_;
  int sched_port_ = 0, server_port_ = 0, http_port_ = 0;
  uint64_t epoch_ = 0;
};

bool Contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

void RaiseFdLimit() {
  rlimit r{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &r) == 0);
  const rlim_t want = 3 * kSilentConnections + 1024;
  if (r.rlim_cur < want) {
    r.rlim_cur = std::min<rlim_t>(want, r.rlim_max);
    ::setrlimit(RLIMIT_NOFILE, &r);
  }
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &r) == 0);
  REQUIRE(r.rlim_cur >= static_cast<rlim_t>(kSilentConnections + 256));
}

}  // namespace

TEST_CASE("hostile peers: garbage and absurd lengths and wrong-role frames are closed or refused and the job keeps its state",
          "[multiproc][net]") {
  RaiseFdLimit();  // before the job starts: the children inherit it
  Job job;

  // Random bytes: native ports close the connection (bad magic), HTTP answers 400 and closes.
  for (int port : {job.sched_port(), job.server_port()}) {
    RawConn c(port);
    REQUIRE(c.ok());
    c.Send(RandomBytes(4096, 1));
    CHECK(c.ReadUntilClosed(5s));
  }
  {
    RawConn c(job.http_port());
    REQUIRE(c.ok());
    c.Send(RandomBytes(4096, 2));
    std::string got;
    CHECK(c.ReadUntilClosed(5s, &got));
    CHECK(Contains(got, "400"));
  }

  // A valid header with absurd lengths: closed before anything is allocated.
  for (int port : {job.sched_port(), job.server_port()}) {
    for (auto [meta_len, data_len] : {std::pair<uint32_t, uint64_t>{0xFFFFFFFFu, 0},
                                      {16, ~0ull}, {16, 1ull << 40}}) {
      comm::FrameHeader h;
      h.meta_len = meta_len;
      h.data_len = data_len;
      RawConn c(port);
      REQUIRE(c.ok());
      c.Send(comm::EncodeHeader(h));
      CHECK(c.ReadUntilClosed(5s));
    }
  }
  {
    RawConn c(job.http_port());
    REQUIRE(c.ok());
    c.Send("POST /cluster/scale_out HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999\r\n\r\n");
    std::string got;
    CHECK(c.ReadUntilClosed(5s, &got));
    CHECK(Contains(got, "413"));
  }
  std::this_thread::sleep_for(200ms);  // let the logs flush
  CHECK(Contains(job.scheduler().Log(), "closing"));
  CHECK(Contains(job.server().Log(), "closing"));

  // Wrong role: a raw client (never registered) sends SCALE_OUT to the scheduler: an error answer.
  {
    RawConn c(job.sched_port());
    REQUIRE(c.ok());
    pb::MessageMeta m;
    m.set_cmd(pb::SCALE_OUT);
    m.set_request_id(7);
    m.set_role(pb::WORKER);
    REQUIRE(c.Send(Frame(m, "")));
    std::optional<pb::MessageMeta> answer = c.ReadMeta(5s);
    REQUIRE(answer.has_value());
    CHECK(answer->is_response());
    CHECK(answer->request_id() == 7);
    CHECK(answer->status_code() != 0);
    CHECK(Contains(answer->error(), "does not serve SCALE_OUT"));
    // A heartbeat and a finish for a node that never registered: refused.
    pb::HeartbeatMessage hb;
    hb.set_node_id("intruder");
    m.set_cmd(pb::HEARTBEAT);
    m.set_request_id(8);
    REQUIRE(c.Send(Frame(m, hb.SerializeAsString())));
    answer = c.ReadMeta(5s);
    REQUIRE(answer.has_value());
    CHECK(answer->status_code() != 0);
    pb::FinishMessage fin;
    fin.set_node_id("intruder");
    m.set_cmd(pb::FINISH);
    m.set_request_id(9);
    REQUIRE(c.Send(Frame(m, fin.SerializeAsString())));
    answer = c.ReadMeta(5s);
    REQUIRE(answer.has_value());
    CHECK(answer->status_code() != 0);
  }
  // A scheduler-only command sent to a server by a raw peer: refused.
  {
    RawConn c(job.server_port());
    REQUIRE(c.ok());
    pb::MessageMeta m;
    m.set_cmd(pb::ADMIN);
    m.set_request_id(3);
    m.set_role(pb::ADMIN_CLIENT);
    REQUIRE(c.Send(Frame(m, "")));
    std::optional<pb::MessageMeta> answer = c.ReadMeta(5s);
    INFO(job.server().Log());
    if (answer.has_value()) {
      CHECK(answer->status_code() != 0);
    }  // else the server closed the connection: also a refusal
  }
  // SEND_DATA from a peer that never said HELLO as a member of the job: refused with
  // permission_denied and the connection closed, for garbage and well-formed pushes alike.
  // A HELLO naming a node that is not a member is refused the same way.
  for (bool well_formed : {false, true}) {
    RawConn c(job.server_port());
    REQUIRE(c.ok());
    pb::MessageMeta m;
    m.set_cmd(pb::SEND_DATA);
    m.set_request_id(11);
    m.set_role(pb::WORKER);
    m.set_handler(node::kPushHandler);
    const uint64_t key = 1ull << 50;
    const uint32_t len = 1;
    const float value = 1.0f;
    BufferPtr push = core::EncodeKvPairs(&key, 1, &len, &value, 1);
    REQUIRE(c.Send(Frame(m, well_formed ? std::string(push->data(), push->size()) : RandomBytes(64, 3))));
    std::optional<pb::MessageMeta> answer = c.ReadMeta(5s);
    REQUIRE(answer.has_value());
    INFO("unregistered SEND_DATA: " << answer->error());
    CHECK(answer->status_code() == static_cast<int>(Code::kPermissionDenied));
    CHECK_FALSE(c.ReadMeta(2s).has_value());  // closed
  }
  {
    RawConn c(job.server_port());
    REQUIRE(c.ok());
    pb::MessageMeta m;
    m.set_cmd(pb::HELLO);
    m.set_request_id(13);
    pb::HelloMessage hello;
    hello.set_node_id("intruder");
    REQUIRE(c.Send(Frame(m, hello.SerializeAsString())));
    std::optional<pb::MessageMeta> answer = c.ReadMeta(5s);
    REQUIRE(answer.has_value());
    CHECK(answer->status_code() == static_cast<int>(Code::kPermissionDenied));
    CHECK_THAT(answer->error(), Catch::Contains("not a member"));
  }
  std::this_thread::sleep_for(200ms);
  CHECK(Contains(job.scheduler().Log(), "which the scheduler does not serve"));
  job.CheckIntact();

  // 2000 connections per port that never speak, plus a half frame then silence on each native
  // port; the job keeps answering and the scheduler's memory stays bounded.
  std::vector<std::unique_ptr<RawConn>> silent;
  for (int port : {job.sched_port(), job.server_port(), job.http_port()}) {
    for (int i = 0; i < kSilentConnections; ++i) {
      auto c = std::make_unique<RawConn>(port);
      if (!c->ok()) break;
      silent.push_back(std::move(c));
    }
  }
  INFO("silent connections opened: " << silent.size());
  CHECK(silent.size() >= 2 * kSilentConnections);
  std::vector<std::unique_ptr<RawConn>> halves;
  for (int port : {job.sched_port(), job.server_port()}) {
    pb::MessageMeta m;
    m.set_cmd(pb::PING);
    std::string f = Frame(m, std::string(1000, 'x'));
    halves.push_back(std::make_unique<RawConn>(port));
    REQUIRE(halves.back()->ok());
    REQUIRE(halves.back()->Send(f.substr(0, f.size() / 2)));
  }
  std::this_thread::sleep_for(500ms);
  job.CheckIntact();
  for (Process* p : {&job.scheduler(), &job.server()}) {
    const int64_t rss = RssKb(p->pid());
    INFO((p == &job.server() ? "server" : "scheduler") << " VmRSS after the storm: " << rss << " kB");
    CHECK(rss > 0);
    CHECK(rss < kRssCeilingKb);
  }
  silent.clear();
  halves.clear();
  std::this_thread::sleep_for(300ms);
  job.CheckIntact();
}

TEST_CASE("hostile peers: a half frame then silence is cut off after the partial-frame timeout",
          "[multiproc][net]") {
  Job job({"--partial_frame_timeout_ms=1000"});
  std::vector<std::unique_ptr<RawConn>> halves;
  for (int port : {job.sched_port(), job.server_port()}) {
    pb::MessageMeta m;
    m.set_cmd(pb::PING);
    std::string f = Frame(m, std::string(1000, 'x'));
    halves.push_back(std::make_unique<RawConn>(port));
    REQUIRE(halves.back()->ok());
    REQUIRE(halves.back()->Send(f.substr(0, f.size() / 2)));
  }
  for (auto& c : halves) CHECK(c->ReadUntilClosed(20s));
  std::this_thread::sleep_for(200ms);  // let the logs flush
  CHECK(Contains(job.scheduler().Log(), "partial frame stalled"));
  CHECK(Contains(job.server().Log(), "partial frame stalled"));
  job.CheckIntact();
}

TEST_CASE("hostile peers: thousands of connections that never speak are all closed after the first-frame timeout",
          "[multiproc][net]") {
  RaiseFdLimit();
  Job job({"--first_frame_timeout_ms=2000"});
  std::vector<std::unique_ptr<RawConn>> silent;
  for (int port : {job.sched_port(), job.server_port()}) {
    for (int i = 0; i < kSilentConnections; ++i) {
      silent.push_back(std::make_unique<RawConn>(port));
      REQUIRE(silent.back()->ok());
    }
  }
  job.CheckIntact();
  // Every one is closed by the process it went to (the test never closes them itself).
  size_t closed = 0;
  for (auto& c : silent) closed += c->ReadUntilClosed(30s) ? 1 : 0;
  CHECK(closed == silent.size());
  std::this_thread::sleep_for(200ms);  // let the logs flush
  for (Process* p : {&job.scheduler(), &job.server()}) {
    CHECK(Contains(p->Log(), "no whole frame within 2000 ms"));
    const int64_t rss = RssKb(p->pid());
    INFO("VmRSS after " << kSilentConnections << " silent connections: " << rss << " kB");
    CHECK(rss > 0);
    CHECK(rss < kRssCeilingKb);
  }
  job.CheckIntact();
}

TEST_CASE("hostile peers: connections that never speak are closed - accepted connections are capped",
          "[multiproc][net]") {
  Job job({"--first_frame_timeout_ms=1000", "--max_connections=40"});
  // The scheduler already holds 3 accepted connections (server, worker, admin client) and
  // the server 1 (the worker): 37 and 39 more fit under the cap; the rest are refused.
  std::vector<std::unique_ptr<RawConn>> sched_conns, server_conns;
  for (int i = 0; i < 60; ++i) {
    sched_conns.push_back(std::make_unique<RawConn>(job.sched_port()));
    server_conns.push_back(std::make_unique<RawConn>(job.server_port()));
    REQUIRE(sched_conns.back()->ok());
    REQUIRE(server_conns.back()->ok());
  }
  // Every one of them is closed: the refused at once, the admitted after about a second.
  const auto start = std::chrono::steady_clock::now();
  for (auto* list : {&sched_conns, &server_conns}) {
    for (auto& c : *list) CHECK(c->ReadUntilClosed(15s));
  }
  INFO("all closed after " << std::chrono::duration_cast<std::chrono::milliseconds>(
                                  std::chrono::steady_clock::now() - start).count() << " ms");
  std::this_thread::sleep_for(200ms);
  for (Process* p : {&job.scheduler(), &job.server()}) {
    INFO(p->Log());
    CHECK(Contains(p->Log(), "no whole frame within 1000 ms"));
    CHECK(Contains(p->Log(), "refusing accepted connections"));
  }
  // The members' own connections spoke long ago and are kept: the job is untouched, and a
  // new connection that speaks at once is served again now that the silent ones are gone.
  job.CheckIntact();
}

}  // namespace pscore::testing
