// The installed package: `cmake --install` of the "dev" component into a temporary
// prefix, then tests/install_consumer (a program outside the tree) is configured with
// find_package(pscore), built, and run (it starts a scheduler, a server and a worker and
// pushes/pulls); the same program is also built from the pkg-config file alone; and the
// complete server and worker of docs/embedding.md, cut out of the page as written, are
// built against the package and run a job with pscore-node's scheduler. Every child
// command runs under `timeout` (which signals its whole process group), so a hang ends as
// a failure.
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

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

// The body of the ```cpp block of `markdown` whose first line is `first_line` ("" if none).
std::string CodeBlock(const std::string& markdown, const std::string& first_line) {
  const std::string open = "```cpp\n" + first_line + "\n";
  size_t begin = markdown.find(open);
  if (begin == std::string::npos) return "";
  begin += open.size() - first_line.size() - 1;
  size_t end = markdown.find("\n```", begin);
  return end == std::string::npos ? "" : markdown.substr(begin, end - begin + 1);
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
  CHECK(std::filesystem::exists(prefix + "/include/pscore/node/worker/worker_node.h"));
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
  SECTION("the complete server and worker of docs/embedding.md build and run a job") {
    const std::string guide = ReadFile(std::string(PSCORE_SOURCE_DIR) + "/docs/embedding.md");
    const std::string server_cc = CodeBlock(guide, "// my_server.cc: a parameter server with the built-in store (SGD) and one named handler.");
    const std::string worker_cc = CodeBlock(guide, "// my_worker.cc: pushes gradients and pulls weights of 8 keys x 1024 floats.");
    REQUIRE_FALSE(server_cc.empty());
    REQUIRE_FALSE(worker_cc.empty());
    const std::string src = dir + "/guide";
    std::filesystem::create_directories(src);
    WriteFile(src + "/my_server.cc", server_cc);
    WriteFile(src + "/my_worker.cc", worker_cc);
    WriteFile(src + "/CMakeLists.txt",
              "cmake_minimum_required(VERSION 3.18)\nproject(guide LANGUAGES CXX)\n"
              "find_package(pscore 0.1 REQUIRED)\n"
              "add_executable(my_server my_server.cc)\ntarget_link_libraries(my_server PRIVATE pscore::pscore)\n"
              "add_executable(my_worker my_worker.cc)\ntarget_link_libraries(my_worker PRIVATE pscore::pscore)\n");
    const std::string build = dir + "/guide-build";
    REQUIRE(Run(cmake + " -S " + src + " -B " + build + " -G \"" PSCORE_CMAKE_GENERATOR "\"" +
                    " -DCMAKE_CXX_COMPILER=" PSCORE_CXX_COMPILER " -DCMAKE_PREFIX_PATH=" + prefix +
                    " \"-DCMAKE_CXX_FLAGS=" PSCORE_CONSUMER_FLAGS "\"",
                log, 120) == 0);
    {
      INFO(ReadFile(log));
      REQUIRE(Run(cmake + " --build " + build + " -j1", log, 240) == 0);
    }
    // The job the guide describes: pscore-node's scheduler, then my_server and my_worker.
    WriteFile(dir + "/job.sh",
              "node=" PSCORE_BIN_DIR "/pscore-node\n"
              "$node --role=scheduler --worker_num=1 --server_num=1 --scheduler_port=0 --port_file=" + dir +
                  "/port & sched=$!\n"
                  "for i in $(seq 200); do [ -s " + dir + "/port ] && break; sleep 0.05; done\n"
                  "port=$(cat " + dir + "/port)\n" +
                  build + "/my_server $port 0 & server=$!\n" +
                  build + "/my_worker $port 0; w=$?\n"
                  "wait $server; s=$?\nwait $sched; c=$?\n"
                  "echo \"guide job: worker $w server $s scheduler $c\"\n"
                  "[ $w = 0 ] && [ $s = 0 ] && [ $c = 0 ]\n");
    const int rc = Run("sh " + dir + "/job.sh", log, 90);
    INFO(ReadFile(log));
    CHECK(rc == 0);
    CHECK_THAT(ReadFile(log), Catch::Contains("guide job: worker 0 server 0 scheduler 0"));
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);  // reached only when no REQUIRE failed
}
