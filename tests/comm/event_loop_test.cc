#include "comm/test_util.h"  // first: sets up Catch's CHECK

#include <pthread.h>
#include <signal.h>

#include <time.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "pscore/comm/event_loop.h"

namespace pscore::comm {

using testing::OneShot;
using testing::OnLoop;

TEST_CASE("loop: a SIGPIPE on the loop thread stays pending there - it does not kill the process",
          "[comm][loop]") {
  // What a write to a connection whose peer is gone raises (EPIPE); the default action of
  // SIGPIPE, which a program embedding pscore may well have, ends the process.
  struct sigaction current {};
  REQUIRE(::sigaction(SIGPIPE, nullptr, &current) == 0);
  REQUIRE(current.sa_handler == SIG_DFL);
  EventLoop loop("sigpipe");
  REQUIRE(loop.Start().ok());
  const bool pending = OnLoop(loop, [] {
    ::pthread_kill(::pthread_self(), SIGPIPE);
    sigset_t set;
    sigemptyset(&set);
    sigpending(&set);
    return sigismember(&set, SIGPIPE) == 1;
  });
  CHECK(pending);
  REQUIRE(loop.Stop().ok());
}

TEST_CASE("loop: posts from 8 threads run exactly once, in per-thread order", "[comm][loop]") {
  constexpr int kThreads = 8;
  constexpr int kPosts = 10000;
  EventLoop loop("posts");
  REQUIRE(loop.Start().ok());
  // Touched only on the loop thread.
  std::vector<std::vector<int>> seen(kThreads);
  std::atomic<int> total{0};
  OneShot<bool> all_done;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPosts; ++i) {
        loop.Post([&, t, i] {
          seen[t].push_back(i);
          if (++total == kThreads * kPosts) all_done.Set(true);
        });
      }
    });
  }
  for (auto& th : threads) th.join();
  REQUIRE(all_done.Get());
  REQUIRE(loop.Stop().ok());
  CHECK(total.load() == kThreads * kPosts);
  for (int t = 0; t < kThreads; ++t) {
    REQUIRE(seen[t].size() == static_cast<size_t>(kPosts));
    bool in_order = true;
    for (int i = 0; i < kPosts; ++i) in_order = in_order && seen[t][i] == i;
    CHECK(in_order);
  }
}

TEST_CASE("loop: Stop with posts still queued neither crashes nor leaks", "[comm][loop]") {
  EventLoop loop("stop-pending");
  REQUIRE(loop.Start().ok());
  std::atomic<int> ran{0};
  std::atomic<bool> go{false};
  // Block the loop so posts pile up, then Stop while they are queued.
  loop.Post([&] {
    while (!go.load()) std::this_thread::yield();
  });
  for (int i = 0; i < 1000; ++i) REQUIRE(loop.Post([&] { ++ran; }));
  Status stop_status(Code::kInternal, "not stopped");
  std::thread stopper([&] { stop_status = loop.Stop(); });
  // Let Stop queue its shutdown behind the pending posts before the loop is released.
  // (Correctness does not depend on this delay; it only makes the interesting order likely.)
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  go = true;
  stopper.join();
  REQUIRE(stop_status.ok());
  // Posts queued before Stop ran; posts after Stop are dropped, never run.
  CHECK(ran.load() == 1000);
  CHECK_FALSE(loop.Post([&] { ran += 1000; }));  // says so: the caller answers its own futures
  CHECK_FALSE(loop.Run([&] { ran += 1000; }));
  CHECK(ran.load() == 1000);
  CHECK(loop.Stop().ok());  // idempotent
}

TEST_CASE("loop: posts made before Start run once it starts - Stop without Start is clean",
          "[comm][loop]") {
  {
    EventLoop loop("prestart");
    OneShot<bool> ran;
    loop.Post([&] { ran.Set(loop.InLoopThread()); });
    REQUIRE(loop.Start().ok());
    CHECK(ran.Get());
    REQUIRE(loop.Stop().ok());
  }
  {
    EventLoop never("never-started");
    int ran = 0;
    never.Post([&] { ++ran; });
    REQUIRE(never.Stop().ok());
    CHECK(ran == 1);
  }
}

TEST_CASE("loop: one-shot, repeating and cancelled timers", "[comm][loop]") {
  EventLoop loop("timers");
  REQUIRE(loop.Start().ok());
  std::atomic<int> one_shot{0};
  std::atomic<int> repeats{0};
  std::atomic<int> cancelled{0};
  OneShot<bool> five_repeats;
  OneShot<bool> one_fired;
  OnLoop(loop, [&] {
    loop.AddTimer(std::chrono::milliseconds(1), Duration::zero(), [&] {
      ++one_shot;
      one_fired.Set(true);
    });
    auto rep = std::make_shared<TimerId>(0);
    *rep = loop.AddTimer(std::chrono::milliseconds(1), std::chrono::milliseconds(2), [&, rep] {
      if (++repeats == 5) {
        loop.CancelTimer(*rep);  // a repeating timer may cancel itself
        five_repeats.Set(true);
      }
    });
    TimerId doomed = loop.AddTimer(std::chrono::milliseconds(30), Duration::zero(), [&] { ++cancelled; });
    loop.CancelTimer(doomed);
    loop.CancelTimer(doomed);      // twice is harmless
    loop.CancelTimer(999999);      // unknown id is harmless
  });
  REQUIRE(one_fired.Get());
  REQUIRE(five_repeats.Get());
  // Give a cancelled timer more than its delay to (wrongly) fire; measured by a loop timer.
  OneShot<bool> later;
  OnLoop(loop, [&] {
    loop.AddTimer(std::chrono::milliseconds(60), Duration::zero(), [&] { later.Set(true); });
  });
  REQUIRE(later.Get());
  CHECK(one_shot.load() == 1);
  CHECK(repeats.load() == 5);
  CHECK(cancelled.load() == 0);
  REQUIRE(loop.Stop().ok());
}

TEST_CASE("loop: Stop cancels live timers and runs stop hooks newest first", "[comm][loop]") {
  EventLoop loop("hooks");
  REQUIRE(loop.Start().ok());
  std::vector<int> order;
  std::atomic<int> fired{0};
  OnLoop(loop, [&] {
    loop.AddTimer(std::chrono::hours(1), Duration::zero(), [&] { ++fired; });
    loop.AddTimer(std::chrono::milliseconds(1), std::chrono::hours(1), [&] { ++fired; });
    loop.AddStopHook([&] { order.push_back(1); });
    uint64_t removed = loop.AddStopHook([&] { order.push_back(99); });
    loop.AddStopHook([&] { order.push_back(2); });
    loop.RemoveStopHook(removed);
  });
  REQUIRE(loop.Stop().ok());  // a live timer left behind would make uv_loop_close fail
  CHECK(order == std::vector<int>{2, 1});
}

TEST_CASE("loop: RunBeforePoll runs queued work once in the same iteration", "[comm][loop]") {
  EventLoop loop("before-poll");
  REQUIRE(loop.Start().ok());
  OneShot<std::vector<int>> result;
  loop.Post([&] {
    auto seq = std::make_shared<std::vector<int>>();
    seq->push_back(0);
    loop.RunBeforePoll([&, seq] {
      seq->push_back(2);
      loop.RunBeforePoll([&, seq] {  // queued from inside the phase: still runs
        seq->push_back(3);
        result.Set(*seq);
      });
    });
    seq->push_back(1);
  });
  CHECK(result.Get() == std::vector<int>{0, 1, 2, 3});
  OneShot<bool> in_loop;
  loop.Run([&] { in_loop.Set(loop.InLoopThread()); });
  CHECK(in_loop.Get());
  CHECK_FALSE(loop.InLoopThread());
  REQUIRE(loop.Stop().ok());
}

TEST_CASE("loop: Run, InLoopThread and running from other threads while Stop runs", "[comm][loop]") {
  // Each call either runs its closure on the loop before the stop, or is refused: never
  // run after Stop returned, never run off the loop while it runs (TSan checks the reads).
  for (int round = 0; round < 20; ++round) {
    EventLoop loop("run-vs-stop");
    REQUIRE(loop.Start().ok());
    std::atomic<bool> stop_done{false};
    std::atomic<int> ran{0}, refused{0}, ran_off_loop{0}, ran_late{0};
    std::vector<std::thread> callers;
    for (int t = 0; t < 3; ++t) {
      callers.emplace_back([&] {
        for (int i = 0; i < 200; ++i) {
          const bool in_loop = loop.InLoopThread();  // false here while the loop runs
          const bool running = loop.running();
          if (running && in_loop) ++ran_off_loop;
          const bool accepted = loop.Run([&] {
            if (stop_done.load()) ++ran_late;
            if (loop.running() && !loop.InLoopThread()) ++ran_off_loop;
            ++ran;
          });
          if (!accepted) ++refused;
          if (i % 16 == 0) std::this_thread::yield();
        }
      });
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200 * (round % 5)));
    REQUIRE(loop.Stop().ok());
    stop_done = true;
    for (auto& c : callers) c.join();
    CHECK(ran_off_loop.load() == 0);
    CHECK(ran_late.load() == 0);
    CHECK(ran.load() + refused.load() == 600);
    CHECK_FALSE(loop.running());
  }
}

// CPU time the calling thread has used so far.
std::chrono::nanoseconds ThreadCpuTime() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
}

TEST_CASE("loop: SpinFor polls without sleeping until the window ends, then the loop sleeps again", "[comm][loop]") {
  using namespace std::chrono_literals;
  EventLoop loop("spin");
  REQUIRE(loop.Start().ok());
  CHECK_FALSE(OnLoop(loop, [&] { return loop.spinning(); }));
  // A window of 300 ms: the loop thread burns CPU through it (a tenth of it is a bound a
  // thread meets with three others on the core), then stops polling on its own.
  const auto opened = std::chrono::steady_clock::now();
  const std::chrono::nanoseconds cpu_at_open = OnLoop(loop, [&] {
    loop.SpinFor(300ms);
    CHECK(loop.spinning());
    return ThreadCpuTime();
  });
  std::this_thread::sleep_for(350ms);
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (OnLoop(loop, [&] { return loop.spinning(); }) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  REQUIRE_FALSE(OnLoop(loop, [&] { return loop.spinning(); }));
  CHECK(std::chrono::steady_clock::now() - opened >= 300ms);
  const std::chrono::nanoseconds cpu_after = OnLoop(loop, [] { return ThreadCpuTime(); });
  CHECK(cpu_after - cpu_at_open >= 30ms);
  // Closed: 300 ms idle cost the loop thread next to nothing.
  std::this_thread::sleep_for(300ms);
  const std::chrono::nanoseconds cpu_idle = OnLoop(loop, [] { return ThreadCpuTime(); });
  CHECK(cpu_idle - cpu_after < 30ms);
  // Windows overlap and the latest end counts: a short one inside a long one ends nothing.
  OnLoop(loop, [&] {
    loop.SpinFor(60s);
    loop.SpinFor(1ms);
  });
  std::this_thread::sleep_for(50ms);
  CHECK(OnLoop(loop, [&] { return loop.spinning(); }));
  // Stopping inside a window is clean: the spin handle is closed with the others.
  REQUIRE(loop.Stop().ok());
}

}  // namespace pscore::comm
