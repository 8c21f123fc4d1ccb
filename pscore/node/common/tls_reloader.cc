#include "pscore/node/common/tls_reloader.h"

#include <pthread.h>
#include <signal.h>

#include <csignal>

#include <chrono>

#include <glog/logging.h>

namespace pscore::node {
namespace {

std::atomic<int> g_reload{0};  // lock-free: safe to set in a signal handler
void OnHangup(int) { g_reload.store(1); }

}  // namespace

TlsReloader::TlsReloader(std::shared_ptr<comm::TlsContext> tls) : tls_(std::move(tls)) {
  if (tls_ == nullptr) return;
  // SIGHUP is blocked in this thread, so in every thread started after it (the node's
  // loops), and taken by sigtimedwait on the reload thread at once. A thread started
  // earlier with SIGHUP unblocked runs the handler instead, which only sets a flag that
  // the reload thread reads at its next wake-up. A reload reads files, which no loop
  // thread may do.
  std::signal(SIGHUP, OnHangup);
  sigset_t hup;
  sigemptyset(&hup);
  sigaddset(&hup, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &hup, nullptr);
  thread_ = std::thread([this, hup] {
    while (!stop_.load()) {
      const timespec wake = {0, 100 * 1000 * 1000};
      const bool signalled = sigtimedwait(&hup, nullptr, &wake) == SIGHUP;
      if (g_reload.exchange(0) == 0 && !signalled) continue;
      Status st = tls_->Reload();
      if (!st.ok()) LOG(ERROR) << "SIGHUP: TLS files not reloaded, the old ones stay in use: " << st;
    }
  });
}

TlsReloader::~TlsReloader() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

}  // namespace pscore::node
