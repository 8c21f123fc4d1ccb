// The demo job (pscore-node scheduler and servers, pscore-train workers) with TLS on
// every link, certificates made by scripts/tls_certs.sh: it ends with the weights of the
// same job in plaintext (loss and weights checksum within 1e-6, as in
// train_restart_mp_test). Before the trainers join: pscore-admin with the admin certificate
// gets the status; a plaintext admin is refused; a server presenting server0's certificate
// but claiming another node id is refused by the scheduler and exits non-zero; the
// scheduler's HTTPS port answers curl with a client certificate (and refuses curl without
// one); SIGHUP reloads the scheduler's certificate without the servers reconnecting, and
// the trainers then connect with the new one; pscore-admin with a server's certificate is
// refused "stop" (not an admin certificate), and on HTTPS GET /v1/nodes and POST /v1/stop
// (403); a trainer SIGHUPed while its certificate
// file is unreadable keeps training on the old one. With TLS, server1 is started without
// --node_id and registers under its certificate's CN. None of it disturbs the job.
#include <signal.h>

#include <cmath>
#include <functional>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "multiproc/process.h"
#include "multiproc/train_log.h"

#include <catch2/catch.hpp>  // last: its CHECK must win over glog's

namespace pscore::testing {
namespace {

using namespace std::chrono_literals;

std::string TrainBinary() { return std::string(PSCORE_BIN_DIR) + "/pscore-train"; }

struct Job {
  std::vector<TrainFinal> finals;
  std::vector<int> codes;
  int scheduler_code = -1;
};

std::vector<std::string> TlsFlags(const std::string& pki, const std::string& name) {
  return {"--tls_cert=" + pki + "/" + name + ".crt", "--tls_key=" + pki + "/" + name + ".key",
          "--tls_ca=" + pki + "/ca.crt"};
}

// Runs the demo job; with `pki` set, every process uses TLS and `during` runs while the
// servers wait for the trainers (given the scheduler and HTTP ports and the scheduler's pid),
// `training` once trainer 0 has printed a step (given that trainer).
Job RunJob(const TempDir& dir, const std::string& pki,
           const std::function<void(int, int, pid_t)>& during = nullptr,
           const std::function<void(Process&)>& training = nullptr) {
  const bool tls = !pki.empty();
  auto args = [&](std::vector<std::string> v, const std::string& name) {
    v.insert(v.end(), {"--heartbeat_interval_ms=200", "--heartbeat_timeout_ms=3000"});
    if (tls) {
      auto f = TlsFlags(pki, name);
      v.insert(v.end(), f.begin(), f.end());
    }
    return v;
  };
  const std::string tag = tls ? "tls-" : "plain-";
  Process scheduler;
  REQUIRE(scheduler.Start(args({NodeBinary(), "--role=scheduler", "--worker_num=2", "--server_num=2",
                                "--scheduler_port=0", "--port_file=" + dir.File(tag + "port"), "--http_port=0",
                                "--http_port_file=" + dir.File(tag + "http")},
                               "scheduler"),
                          dir.File(tag + "scheduler.log")));
  const int port = ReadPortFile(dir.File(tag + "port"), 20s);
  REQUIRE(port > 0);
  const int http = ReadPortFile(dir.File(tag + "http"), 20s);
  std::vector<std::unique_ptr<Process>> servers, trainers;
  for (int i = 0; i < 2; ++i) {
    const std::string name = "server" + std::to_string(i);
    servers.push_back(std::make_unique<Process>());
    // With TLS, server1 gives no --node_id: it takes its certificate's CN (server1).
    std::vector<std::string> argv = {NodeBinary(), "--role=server", "--scheduler_port=" + std::to_string(port),
                                     "--update_rule=sgd", "--learning_rate=2"};
    if (!tls || i == 0) argv.push_back("--node_id=" + name);
    REQUIRE(servers.back()->Start(args(argv, name),
                                  dir.File(tag + name + ".log")));
  }
  // Before the trainers join (the job cannot end meanwhile): the scheduler and servers are up.
  if (during) during(port, http, scheduler.pid());
  for (int i = 0; i < 2; ++i) {
    const std::string name = "worker" + std::to_string(i);
    trainers.push_back(std::make_unique<Process>());
    REQUIRE(trainers.back()->Start(
        args({TrainBinary(), "--node_id=" + name, "--scheduler_port=" + std::to_string(port), "--steps=60"}, name),
        dir.File(tag + name + ".log")));
  }
  if (training) {
    const auto deadline = std::chrono::steady_clock::now() + 120s;
    while (trainers[0]->running() && trainers[0]->Log().find("step ") == std::string::npos &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(5ms);
    }
    training(*trainers[0]);
  }
  Job job;
  for (int i = 0; i < 2; ++i) {
    std::optional<int> code = trainers[i]->Wait(150s);
    INFO(tag << "worker" << i << " log:\n" << trainers[i]->Log());
    job.codes.push_back(code.value_or(-1));
    job.finals.push_back(ParseTrainFinal(trainers[i]->Log()));
  }
  for (auto& s : servers) CHECK(s->Wait(60s).value_or(-1) == 0);
  CHECK(servers[1]->Log().find("server1 registered as rank") != std::string::npos);
  job.scheduler_code = scheduler.Wait(60s).value_or(-1);
  INFO(tag << "scheduler log:\n" << scheduler.Log());
  CHECK(job.scheduler_code == 0);
  return job;
}

// Runs a short-lived process to its end; its exit code (-1 if it ran past 60 s).
int RunToEnd(const std::vector<std::string>& argv, const std::string& log, std::string* out) {
  Process p;
  if (!p.Start(argv, log)) return -1;
  const int code = p.Wait(60s).value_or(-1);
  *out = p.Log();
  return code;
}

}  // namespace

TEST_CASE("the demo job with TLS on every link ends with the plaintext job's weights and impostors are refused",
          "[multiproc][net][tls]") {
  TempDir dir;
  REQUIRE(dir.ok());
  const std::string pki = dir.File("pki");
  const std::string script = std::string(PSCORE_SOURCE_DIR) + "/scripts/tls_certs.sh";
  REQUIRE(std::system((script + " " + pki + " scheduler admin server0 server1 worker0 worker1 >/dev/null").c_str()) ==
          0);

  Job plain = RunJob(dir, "");
  Job tls = RunJob(dir, pki, [&](int port, int http, pid_t scheduler) {
    const std::string p = "--scheduler_port=" + std::to_string(port);
    std::string out;
    // The operator's certificate (CN=admin) reaches the scheduler.
    std::vector<std::string> admin = {AdminBinary(), p, "--timeout_ms=20000"};
    for (const std::string& f : TlsFlags(pki, "admin")) admin.push_back(f);
    admin.push_back("status");
    CHECK(RunToEnd(admin, dir.File("admin.log"), &out) == 0);
    INFO("admin: " << out);
    // Without TLS the admin gets nowhere.
    CHECK(RunToEnd({AdminBinary(), p, "--timeout_ms=3000", "status"}, dir.File("plain-admin.log"), &out) != 0);
    // A member's certificate is not an operator's: "stop" is refused, naming why, and the
    // job goes on (it ends with the plaintext job's weights below).
    std::vector<std::string> member_admin = {AdminBinary(), p, "--timeout_ms=20000"};
    for (const std::string& f : TlsFlags(pki, "server0")) member_admin.push_back(f);
    member_admin.push_back("stop");
    CHECK(RunToEnd(member_admin, dir.File("member-admin.log"), &out) != 0);
    INFO("admin with server0's certificate: " << out);
    CHECK(out.find("not an admin certificate") != std::string::npos);
    CHECK(out.find("CN=server0") != std::string::npos);
    // server0's certificate, another node's id: refused at REGISTER.
    std::vector<std::string> impostor = {NodeBinary(), "--role=server", "--node_id=server9", p,
                                         "--connect_timeout_ms=5000", "--recovery_timeout_ms=5000"};
    for (const std::string& f : TlsFlags(pki, "server0")) impostor.push_back(f);
    const int code = RunToEnd(impostor, dir.File("impostor.log"), &out);
    INFO("impostor: " << out);
    CHECK(code != 0);
    CHECK(out.find("does not match the TLS certificate") != std::string::npos);
    // HTTPS with a client certificate, when curl is installed.
    if (http > 0 && ::access("/usr/bin/curl", X_OK) == 0) {
      const std::string url = "https://127.0.0.1:" + std::to_string(http) + "/metrics";
      const std::string curl = "/usr/bin/curl -sf --max-time 20 --cacert " + pki + "/ca.crt --cert " + pki +
                               "/admin.crt --key " + pki + "/admin.key " + url + " >" + dir.File("metrics.txt");
      CHECK(std::system(curl.c_str()) == 0);
      CHECK(ReadFile(dir.File("metrics.txt")).find("pscore_tls_cert_expiry_seconds{cn=\"scheduler\"}") != std::string::npos);
      // No client certificate: the handshake fails.
      CHECK(std::system(("/usr/bin/curl -sf --max-time 20 --cacert " + pki + "/ca.crt " + url + " >/dev/null 2>&1")
                            .c_str()) != 0);
      // server0's certificate on HTTPS: no admin either (403 for GET /v1/nodes and POST /v1/stop).
      const std::string member_curl = "/usr/bin/curl -s --max-time 20 -o /dev/null -w '%{http_code}' --cacert " + pki +
                                      "/ca.crt --cert " + pki + "/server0.crt --key " + pki + "/server0.key ";
      const std::string base = "https://127.0.0.1:" + std::to_string(http);
      CHECK(std::system((member_curl + base + "/v1/nodes >" + dir.File("code1.txt")).c_str()) == 0);
      CHECK(ReadFile(dir.File("code1.txt")) == "403");
      CHECK(std::system((member_curl + "-X POST " + base + "/v1/stop >" + dir.File("code2.txt")).c_str()) == 0);
      CHECK(ReadFile(dir.File("code2.txt")) == "403");
      // SIGHUP reloads the scheduler's certificate (a new one of two days, same CA): the
      // next HTTPS scrape reports it, and no member had to connect again meanwhile.
      auto scrape = [&] {
        CHECK(std::system(curl.c_str()) == 0);
        return ReadFile(dir.File("metrics.txt"));
      };
      auto value = [](const std::string& text, const std::string& name) {
        const size_t at = text.find(name);
        return at == std::string::npos ? -1.0 : std::strtod(text.c_str() + at + name.size() + 1, nullptr);
      };
      const std::string ok_name = "pscore_tls_handshakes_total{result=\"ok\"}";
      const std::string expiry_name = "pscore_tls_cert_expiry_seconds{cn=\"scheduler\"}";
      // Both servers, the admin, the member's admin and the impostor have completed their
      // TLS handshakes (five), so none is left to come during the reload below.
      std::string before = scrape();
      for (int i = 0; i < 200 && value(before, ok_name) < 5; ++i) {
        std::this_thread::sleep_for(100ms);
        before = scrape();
      }
      CHECK(value(before, ok_name) >= 5);
      CHECK(value(before, expiry_name) > 20 * 86400);
      const std::string pki2 = dir.File("pki2");
      REQUIRE(std::system(("mkdir -p " + pki2 + " && cp " + pki + "/ca.crt " + pki + "/ca.key " + pki2 + " && DAYS=2 " +
                           script + " " + pki2 + " scheduler >/dev/null && cp " + pki2 + "/scheduler.crt " + pki2 +
                           "/scheduler.key " + pki + "/")
                              .c_str()) == 0);
      REQUIRE(::kill(scheduler, SIGHUP) == 0);
      std::string after;
      for (int i = 0; i < 100; ++i) {
        after = scrape();
        if (value(after, expiry_name) < 3 * 86400) break;
        std::this_thread::sleep_for(100ms);
      }
      CHECK(value(after, expiry_name) < 3 * 86400);
      CHECK(value(after, ok_name) == value(before, ok_name));
    }
  }, [&](Process& trainer0) {
    // pscore-train reads its TLS files again on SIGHUP (without a handler the signal would
    // end it): its certificate file is garbage now, so it logs that the old one stays in
    // use and trains on (the job's outcome is checked below).
    REQUIRE(std::system(("echo garbage >" + pki + "/worker0.crt").c_str()) == 0);
    trainer0.Signal(SIGHUP);
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (trainer0.Log().find("SIGHUP: TLS files not reloaded") == std::string::npos &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(20ms);
    }
    INFO("worker0 log:\n" << trainer0.Log());
    CHECK(trainer0.Log().find("SIGHUP: TLS files not reloaded, the old ones stay in use") != std::string::npos);
  });
  for (int i = 0; i < 2; ++i) {
    CHECK(plain.codes[i] == 0);
    CHECK(tls.codes[i] == 0);
    REQUIRE(plain.finals[i].found);
    REQUIRE(tls.finals[i].found);
    INFO("trainer " << i << ": loss " << plain.finals[i].loss << " vs " << tls.finals[i].loss << ", checksum "
                    << plain.finals[i].checksum << " vs " << tls.finals[i].checksum);
    CHECK(std::fabs(plain.finals[i].loss - tls.finals[i].loss) <= 1e-6);
    CHECK(std::fabs(plain.finals[i].checksum - tls.finals[i].checksum) <= 1e-6);
  }
}

}  // namespace pscore::testing
