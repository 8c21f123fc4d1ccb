#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <glog/logging.h>

int main(int argc, char* argv[]) {
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = 1;  // warnings and up; tests print only what matters
  return Catch::Session().run(argc, argv);
}
