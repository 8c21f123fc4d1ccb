// Frames that announce a payload just under --max_message_bytes (256 MiB), send a few
// bytes of it and fall silent, from 200 connections each against a real scheduler and a
// real server running under an address-space limit (RLIMIT_AS, 3 GB): memory for a frame
// is committed as its bytes arrive, so both stay up, their address space grows by a
// bounded amount, and the members keep heartbeating (the job stays READY in its epoch
// for longer than the heartbeat timeout). Children are SIGKILLed by pid at the end.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "pscore/comm/frame.h"
#include "pscore/core/sanitizers.h"
#include "pscore/node/common/admin_client.h"
#include "pscore/proto/comm.pb.h"
#include "multiproc/process.h"
#include "multiproc/raw_conn.h"

#include <catch2/catch.hpp>  // last: its CHECK must win over glog's

namespace pscore::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr int kAttackers = 200;             // connections per attacked process
constexpr int64_t kAddressLimitKb = 3000000;  // ulimit -v of the scheduler and the server
// What 200 frames may add to a process's address space: a 256 KiB chunk each is 50 MiB;
// the old behaviour (a buffer sized from the header) needed 200 x 256 MiB.
constexpr int64_t kGrowthCeilingKb = 400 * 1024;

// The start of a frame: a header announcing just under 256 MiB, a meta, 10 payload bytes.
std::string HugeFrameStart(uint64_t request_id) {
  pb::MessageMeta m;
  m.set_cmd(pb::SEND_DATA);
  m.set_request_id(request_id);
  const std::string meta = m.SerializeAsString();
  comm::FrameHeader h;
  h.meta_len = static_cast<uint32_t>(meta.size());
  h.data_len = (uint64_t{256} << 20) - 64;
  return comm::EncodeHeader(h) + meta + std::string(10, 'x');
}

void RaiseFdLimit() {
  rlimit r{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &r) == 0);
  const rlim_t want = 4 * kAttackers + 1024;
  if (r.rlim_cur < want) {
    r.rlim_cur = std::min<rlim_t>(want, r.rlim_max);
    ::setrlimit(RLIMIT_NOFILE, &r);
  }
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &r) == 0);
  REQUIRE(r.rlim_cur >= static_cast<rlim_t>(2 * kAttackers + 256));
}

// AddressSanitizer and ThreadSanitizer reserve terabytes of shadow address space at start,
// so a sanitized build cannot run under RLIMIT_AS at all. There the processes run without
// the limit, and the bound on their address-space growth below is what is checked.
constexpr bool kShadowMemory = kAddressSanitizer || kThreadSanitizer;

// argv run under `ulimit -v kAddressLimitKb` (the shell execs it: same pid).
std::vector<std::string> Limited(const std::vector<std::string>& argv) {
  if (kShadowMemory) return argv;
  std::string cmd = "ulimit -v " + std::to_string(kAddressLimitKb) + " && exec";
  for (const std::string& a : argv) cmd += " '" + a + "'";
  return {"/bin/sh", "-c", cmd};
}

}  // namespace

TEST_CASE("frames announcing 256 MiB from 200 connections leave a scheduler and a server under ulimit -v up and serving",
          "[multiproc][net]") {
  RaiseFdLimit();
  TempDir dir;
  REQUIRE(dir.ok());
  const std::vector<std::string> timing = {"--heartbeat_interval_ms=100", "--heartbeat_timeout_ms=2000"};
  Process scheduler, server, worker;
  std::vector<std::string> argv = {NodeBinary(), "--role=scheduler", "--scheduler_port=0", "--worker_num=1",
                                   "--server_num=1", "--port_file=" + dir.File("sched.port")};
  argv.insert(argv.end(), timing.begin(), timing.end());
  REQUIRE(scheduler.Start(Limited(argv), dir.File("scheduler.log")));
  const int sched_port = ReadPortFile(dir.File("sched.port"), 10s);
  REQUIRE(sched_port > 0);
  for (std::string role : {"server", "worker"}) {
    std::vector<std::string> a = {NodeBinary(), "--role=" + role, "--node_id=" + role.substr(0, 1) + "0",
                                  "--scheduler_port=" + std::to_string(sched_port), "--auto_finish=false",
                                  "--port_file=" + dir.File(role + ".port")};
    a.insert(a.end(), timing.begin(), timing.end());
    REQUIRE((role == "server" ? server : worker).Start(role == "server" ? Limited(a) : a, dir.File(role + ".log")));
  }
  const int server_port = ReadPortFile(dir.File("server.port"), 10s);
  REQUIRE(server_port > 0);
  node::AdminClientOptions o;
  o.scheduler_port = sched_port;
  o.timeout = 5s;
  node::AdminClient admin(o);
  REQUIRE(admin.Connect().ok());
  Result<pb::AdminResponse> ready = admin.WaitForReady(15s);
  REQUIRE(ready.ok());
  const uint64_t epoch = ready->epoch();
  const int64_t sched_vm0 = StatusKb(scheduler.pid(), "VmSize:");
  const int64_t server_vm0 = StatusKb(server.pid(), "VmSize:");
  REQUIRE(sched_vm0 > 0);
  REQUIRE(server_vm0 > 0);

  std::vector<std::unique_ptr<RawConn>> attackers;
  for (int port : {sched_port, server_port}) {
    for (int i = 0; i < kAttackers; ++i) {
      auto c = std::make_unique<RawConn>(port);
      REQUIRE(c->ok());
      REQUIRE(c->Send(HugeFrameStart(static_cast<uint64_t>(i + 1))));
      attackers.push_back(std::move(c));
    }
  }
  // The attackers stay connected and silent for longer than the heartbeat timeout: the
  // members must keep heartbeating through it.
  const auto until = Clock::now() + 3s;
  while (Clock::now() < until) {
    REQUIRE(scheduler.running());
    REQUIRE(server.running());
    Result<pb::AdminResponse> st = admin.Admin("status");
    REQUIRE(st.ok());
    CHECK(st->cluster_state() == pb::CLUSTER_READY);
    CHECK(st->epoch() == epoch);
    std::this_thread::sleep_for(200ms);
  }
  const int64_t sched_vm = StatusKb(scheduler.pid(), "VmSize:");
  const int64_t server_vm = StatusKb(server.pid(), "VmSize:");
  INFO("scheduler VmSize " << sched_vm0 << " -> " << sched_vm << " KiB, VmRSS "
                           << StatusKb(scheduler.pid(), "VmRSS:") << " KiB");
  INFO("server VmSize " << server_vm0 << " -> " << server_vm << " KiB, VmRSS "
                        << StatusKb(server.pid(), "VmRSS:") << " KiB");
  CHECK(sched_vm - sched_vm0 < kGrowthCeilingKb);
  CHECK(server_vm - server_vm0 < kGrowthCeilingKb);
  CHECK(scheduler.running());
  CHECK(server.running());
  CHECK(worker.running());
  Result<pb::AdminResponse> st = admin.Admin("status");
  REQUIRE(st.ok());
  CHECK(st->cluster_state() == pb::CLUSTER_READY);
  CHECK(st->epoch() == epoch);
  attackers.clear();
  worker.Kill();
  server.Kill();
  scheduler.Kill();
}

}  // namespace pscore::testing
