// The installed package: `cmake --install` of the "dev" component into a temporary
// prefix, then tests/install_consumer (a program outside the tree) is configured with
// find_package(pscore), built, and run (it starts a scheduler, a server and a worker and
// pushes/pulls); the same program is also built from the pkg-config file alone. Every
// child command runs under `timeout`, so a hang ends as a failure.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <catch2/catch.hpp>

namespace {

// Runs `cmd` through the shell under `timeout`, output appended to `log`; the exit code.
int Run(const std::string& cmd, const std::string& log, int seconds) {
  std::string full = "timeout -k 5 " + std::to_string(seconds) + " sh -c '" + cmd + "' >>" + log + " 2>&1";
  int rc = std::system(full.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST_CASE("a program outside the tree builds against the installed package and runs a worker",
          "[node][net][install]") {
  char tmpl[] = "/tmp/pscore-install-test.XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  const std::string dir = tmpl;
  const std::string prefix = dir + "/prefix";
  const std::string log = dir + "/log.txt";
  const std::string cmake = PSCORE_CMAKE_COMMAND;
  const std::string consumer = std::string(PSCORE_SOURCE_DIR) + "/tests/install_consumer";
  INFO("log in " << log);

  REQUIRE(Run(cmake + " --install " PSCORE_BIN_DIR " --prefix " + prefix + " --component dev", log, 120) == 0);
  CHECK(std::filesystem::exists(prefix + "/lib/cmake/pscore/pscoreConfig.cmake"));
  CHECK(std::filesystem::exists(prefix + "/include/pscore/node/worker_node.h"));
  CHECK(std::filesystem::exists(prefix + "/include/pscore/proto/comm.pb.h"));
  CHECK_FALSE(std::filesystem::exists(prefix + "/include/pscore/comm/uv_status.h"));

  SECTION("find_package(pscore) gives pscore::pscore") {
    const std::string build = dir + "/build";
    REQUIRE(Run(cmake + " -S " + consumer + " -B " + build + " -G \"" PSCORE_CMAKE_GENERATOR "\"" +
                    " -DCMAKE_CXX_COMPILER=" PSCORE_CXX_COMPILER " -DCMAKE_PREFIX_PATH=" + prefix +
                    " \"-DCMAKE_CXX_FLAGS=" PSCORE_CONSUMER_FLAGS "\"",
                log, 120) == 0);
    REQUIRE(Run(cmake + " --build " + build + " -j1", log, 240) == 0);
    INFO(ReadFile(log));
    REQUIRE(Run(build + "/pscore_consumer", log, 60) == 0);
    CHECK_THAT(ReadFile(log), Catch::Contains("pscore_consumer ok: hello, consumer"));
  }
  SECTION("pkg-config --cflags --libs pscore is enough to build it") {
    if (Run("command -v pkg-config", log, 10) != 0) {
      WARN("pkg-config is not installed; skipped");
      return;
    }
    const std::string env = "PKG_CONFIG_PATH=" + prefix + "/lib/pkgconfig";
    const std::string exe = dir + "/pc_consumer";
    REQUIRE(Run(std::string(PSCORE_CXX_COMPILER) + " " PSCORE_CONSUMER_FLAGS " -o " + exe + " " + consumer + "/main.cc $(" + env +
                    " pkg-config --cflags --libs pscore)",
                log, 240) == 0);
    INFO(ReadFile(log));
    REQUIRE(Run(exe, log, 60) == 0);
    CHECK_THAT(ReadFile(log), Catch::Contains("pscore_consumer ok: hello, consumer"));
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);  // reached only when no REQUIRE failed
}
