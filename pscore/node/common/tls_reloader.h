// TlsReloader: with TLS, SIGHUP reads the process's certificate, key and CA files again
// (comm::TlsContext::Reload) on a thread of its own; connections made afterwards use them,
// established ones keep their session. Owned by main() of pscore-node and pscore-train,
// one per process (it installs the SIGHUP handler); inert when the process has no TLS.
#pragma once

#include <atomic>
#include <memory>
#include <thread>

#include "pscore/comm/tls.h"

namespace pscore::node {

class TlsReloader {
 public:
  explicit TlsReloader(std::shared_ptr<comm::TlsContext> tls);
  ~TlsReloader();
  TlsReloader(const TlsReloader&) = delete;
  TlsReloader& operator=(const TlsReloader&) = delete;

 private:
  std::shared_ptr<comm::TlsContext> tls_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace pscore::node
