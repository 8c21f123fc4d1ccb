// Blocking request/answer on raw sockets, coord_bench's baseline: `threads` threads,
// each with its own loopback TCP connection (blocking_baseline.h's framing), write a request
// of `bytes` and read the answer; one epoll thread reads every request and writes each
// answer (the same bytes back). No protocol, no parsing, no store: only the sockets and the
// thread wake-ups a blocking call cannot avoid. Answers per second over `seconds`.
//
// RawBlockingReleaseUs is the same for a barrier's release: `nodes` - 1 threads wait
// in a read on their own connections; the last caller writes its request to the answering
// thread, which then writes an answer on every connection, its own included. Per round, from
// just before that request to the last of the `nodes` reads returning (coord_bench's
// barrier64_release_* measure the same span).
#pragma once

#include <sys/epoll.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bench/blocking_baseline.h"

namespace pscore::bench {

inline double RawBlockingCallsPerSecond(int threads, size_t bytes, double seconds) {
  std::vector<SocketPair> pairs;
  for (int t = 0; t < threads; ++t) pairs.push_back(ConnectedPair());
  const int ep = ::epoll_create1(0);
  for (int t = 0; t < threads; ++t) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = pairs[t].server;
    CHECK_EQ(::epoll_ctl(ep, EPOLL_CTL_ADD, pairs[t].server, &ev), 0);
  }
  std::atomic<bool> stop{false};          // callers: no new request
  std::atomic<bool> callers_done{false};  // the server: every caller has its last answer
  std::atomic<uint64_t> calls{0};
  // The answering thread: every readable connection holds one whole request (its caller
  // waits for the answer before it writes again), so one message is read and answered.
  std::thread server([&] {
    std::vector<char> buf;
    std::vector<epoll_event> ready(threads);
    while (!callers_done.load(std::memory_order_relaxed)) {
      const int n = ::epoll_wait(ep, ready.data(), threads, 50);
      for (int i = 0; i < n; ++i) {
        const int fd = ready[i].data.fd;
        const uint64_t size = RecvMessage(fd, &buf);
        SendMessage(fd, buf.data(), size);
      }
    }
  });
  std::vector<std::thread> callers;
  const std::string request(bytes, 'r');
  const auto start = std::chrono::steady_clock::now();
  for (int t = 0; t < threads; ++t) {
    callers.emplace_back([&, fd = pairs[t].client] {
      std::vector<char> buf;
      while (!stop.load(std::memory_order_relaxed)) {
        SendMessage(fd, request.data(), request.size());
        RecvMessage(fd, &buf);
        calls.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& c : callers) c.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  callers_done = true;
  server.join();
  ::close(ep);
  for (auto& p : pairs) p.Close();
  return calls.load() / secs;
}

inline std::vector<double> RawBlockingReleaseUs(int nodes, int rounds) {
  using Clock = std::chrono::steady_clock;
  std::vector<SocketPair> pairs;  // [nodes - 1]: the last caller's
  for (int i = 0; i < nodes; ++i) pairs.push_back(ConnectedPair());
  const std::string answer(100, 'a');
  std::thread answering([&] {
    std::vector<char> buf;
    for (int r = 0; r < rounds; ++r) {
      RecvMessage(pairs[nodes - 1].server, &buf);
      for (auto& p : pairs) SendMessage(p.server, answer.data(), answer.size());
    }
  });
  std::mutex mu;
  std::condition_variable cv;
  int waiting = 0, released = 0;
  std::vector<Clock::time_point> last_read(rounds);
  auto read_answer = [&](int i, int r) {
    std::vector<char> buf;
    RecvMessage(pairs[i].client, &buf);
    const auto t = Clock::now();
    std::lock_guard<std::mutex> lock(mu);
    last_read[r] = std::max(last_read[r], t);
    if (++released == (r + 1) * nodes) cv.notify_all();  // only the round's last wakes anyone
  };
  std::vector<std::thread> waiters;
  for (int i = 0; i < nodes - 1; ++i) {
    waiters.emplace_back([&, i] {
      for (int r = 0; r < rounds; ++r) {
        {
          std::lock_guard<std::mutex> lock(mu);
          if (++waiting == (r + 1) * (nodes - 1)) cv.notify_all();
        }
        read_answer(i, r);
      }
    });
  }
  std::vector<double> out;
  for (int r = 0; r < rounds; ++r) {
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return waiting == (r + 1) * (nodes - 1) && released == r * nodes; });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // every waiter is in its read
    const auto t0 = Clock::now();
    SendMessage(pairs[nodes - 1].client, answer.data(), answer.size());
    read_answer(nodes - 1, r);
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return released == (r + 1) * nodes; });
    out.push_back(std::chrono::duration<double, std::micro>(last_read[r] - t0).count());
  }
  for (auto& w : waiters) w.join();
  answering.join();
  for (auto& p : pairs) p.Close();
  return out;
}

}  // namespace pscore::bench
