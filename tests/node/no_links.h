// ServerLinks for a server tested without sockets: every call to another server fails
// kUnavailable. Include before Catch.
#pragma once

#include <functional>

#include "pscore/node/server/server_links.h"

namespace pscore::testing {

class NoLinks : public node::ServerLinks {
 public:
  void CallServer(int, pb::MessageMeta, BufferPtr, std::function<void(Result<comm::Frame>)> done) override {
    done(Status(Code::kUnavailable, "test: no other servers"));
  }
};

}  // namespace pscore::testing
