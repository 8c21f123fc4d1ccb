// The TLS pass of the multi-process tests: with PSCORE_TEST_TLS=1 in the test's
// environment, every pscore-node, pscore-train and pscore-admin a test starts through
// Process gets --tls_cert/--tls_key/--tls_ca, and the in-process nodes and admin clients
// of the tests that take part get a TLS context (TestTlsContext). One CA per test process
// (comm/tls_pki.h: the OpenSSL API, files in a temporary directory removed at exit) and one
// certificate per name on first use: CN = the node id (--node_id), "scheduler" for the
// scheduler, "admin" for pscore-admin, as docs/security.md's identity rule wants. Test
// thread only.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <memory>
#include <string>
#include <vector>

#include "pscore/comm/tls.h"
#include "comm/tls_pki.h"

namespace pscore::testing {

inline bool TestTlsOn() {
  const char* v = std::getenv("PSCORE_TEST_TLS");
  return v != nullptr && std::string(v) == "1";
}

// The cluster CA and the certificates made so far (only when TestTlsOn()).
class TlsPassPki {
 public:
  static TlsPassPki& Get() {
    static TlsPassPki pki;
    return pki;
  }

  // `name`'s files (CN=name), made on first use.
  comm::TlsFiles Files(const std::string& name) {
    auto it = made_.find(name);
    if (it == made_.end()) it = made_.emplace(name, pki_.Issue(name, name)).first;
    return it->second;
  }
  std::vector<std::string> Flags(const std::string& name) {
    const comm::TlsFiles f = Files(name);
    return {"--tls_cert=" + f.cert, "--tls_key=" + f.key, "--tls_ca=" + f.ca};
  }

 private:
  TlsPassPki() = default;
  comm::testing::TestPki pki_;
  std::map<std::string, comm::TlsFiles> made_;
};

// In the TLS pass: a context whose certificate names `name` (throws if it cannot be
// made, failing the test); otherwise null, which is plaintext.
inline std::shared_ptr<comm::TlsContext> TestTlsContext(const std::string& name) {
  if (!TestTlsOn()) return nullptr;
  Result<std::shared_ptr<comm::TlsContext>> ctx = comm::TlsContext::Load(TlsPassPki::Get().Files(name));
  if (!ctx.ok()) throw std::runtime_error("TLS pass: " + ctx.status().ToString());
  return *ctx;
}

// In the TLS pass: argv with the TLS flags of the identity it runs as, when argv[0] is
// one of our binaries and argv sets no TLS flag itself (tests of TLS choose their own).
// A member started without --node_id gets a certificate of its own ("<role>-anon-N") and
// registers under that name.
inline std::vector<std::string> WithTestTls(std::vector<std::string> argv) {
  if (!TestTlsOn() || argv.empty()) return argv;
  const std::string exe = std::filesystem::path(argv[0]).filename().string();
  if (exe != "pscore-node" && exe != "pscore-train" && exe != "pscore-admin") return argv;
  std::string name = exe == "pscore-admin" ? "admin" : "";
  std::string role = exe == "pscore-train" ? "worker" : "";
  for (const std::string& a : argv) {
    if (a.rfind("--tls_", 0) == 0 || a == "--help" || a == "--version") return argv;
    if (a.rfind("--node_id=", 0) == 0) name = a.substr(10);
    if (a.rfind("--role=", 0) == 0) role = a.substr(7);
  }
  if (role == "scheduler") name = "scheduler";
  if (name.empty()) {
    static int anon = 0;
    name = (role.empty() ? std::string("node") : role) + "-anon-" + std::to_string(anon++);
  }
  for (const std::string& f : TlsPassPki::Get().Flags(name)) argv.push_back(f);
  return argv;
}

}  // namespace pscore::testing
