// deploy/k8s/ checked offline (no cluster is reachable here): tests/deploy/check_k8s.py
// parses the manifests, checks their fields against the k8s launcher and each binary's
// --help, then runs a scheduler, a server and a trainer from them on 127.0.0.1 and fetches
// every probed HTTP path. This test runs it and asserts its verdict.
#include <string>

#include "multiproc/process.h"

#include <catch2/catch.hpp>

namespace pscore::testing {

TEST_CASE("the Kubernetes manifests parse, use only existing flags and probes, and run a job",
          "[multiproc][deploy]") {
  TempDir dir;
  REQUIRE(dir.ok());
  Process check;
  REQUIRE(check.Start({"/usr/bin/python3", std::string(PSCORE_SOURCE_DIR) + "/tests/deploy/check_k8s.py",
                       PSCORE_SOURCE_DIR, PSCORE_BIN_DIR},
                      dir.File("check.log")));
  std::optional<int> code = check.Wait(std::chrono::seconds(200));
  INFO(check.Log());
  REQUIRE(code.has_value());
  CHECK(*code == 0);
  CHECK_THAT(check.Log(), Catch::Contains("k8s manifests: ok"));
}

}  // namespace pscore::testing
