// Control-plane benchmark (scripts/bench.sh control). A real SchedulerNode runs on its own
// loop thread; simulated members are lightweight clients on a second loop, each on its own
// TCP connection, speaking REGISTER / HEARTBEAT / FETCH_METADATA protobufs directly (a
// member whose heartbeat answer shows a newer epoch fetches the metadata, as a node does).
// One run measures, for --members=N (optionally with --burner, a thread spinning on a
// core beside the scheduler's):
//   1. READY time: from the first connect until every member heard READY;
//   2. REGISTER failures (a REGISTER timing out or refused) during that storm;
//   3. heartbeat answer bytes: payload bytes of every heartbeat answer the members got,
//      divided by their number, and the largest one;
//   4. scheduler CPU per heartbeat with every member beating every 100 ms: the scheduler
//      loop thread's own CPU time (CLOCK_THREAD_CPUTIME_ID, read on that thread through
//      Post) over a window, divided by the heartbeats it served in that window;
//   5. time from a member's death (it stops beating) to the last survivor hearing of it;
//   6. peak RSS (getrusage ru_maxrss): of the whole process when the members run on a
//      thread of it (peak_rss), else of the scheduler's process (scheduler_peak_rss) and
//      of the members' (members_peak_rss);
//   7. metadata bytes the scheduler wrote until READY (the READY push is most of it).
// --whole_to_servers gives servers the whole membership however large (the baseline for
// the server's view, SchedulerOptions::server_metadata_view_over).
// The members run in a second process (fork, before any thread starts) with
// --processes=2, or by default when one process's hard open-file limit cannot hold both
// ends of every member's connection (2 fds per member: 10,000 members need a limit over
// 20,064). The burner then spins in the scheduler's process.
// Prints `name value unit` lines.
#include <poll.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>

#include "pscore/comm/event_loop.h"
#include "pscore/comm/messenger.h"
#include "pscore/node/common/wire.h"
#include "pscore/node/scheduler/scheduler_node.h"

namespace pscore::bench {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using comm::ConnId;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

void Print(const char* name, double value, const char* unit) { std::printf("%s %.3f %s\n", name, value, unit); }

void RaiseFdLimit(size_t need) {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
  if (rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  if (rl.rlim_cur < need) {
    std::fprintf(stderr, "control_bench: open-file limit %llu < %zu needed; results may fail\n",
                 static_cast<unsigned long long>(rl.rlim_cur), need);
  }
}

double ThreadCpuUs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

// Runs fn on `loop` and waits for its result.
template <typename T>
T OnLoop(comm::EventLoop* loop, std::function<T()> fn) {
  std::packaged_task<T()> task(std::move(fn));
  auto fut = task.get_future();
  loop->Post([&task] { task(); });
  return fut.get();
}

// Reads only cluster_state and epoch of a SendMetadataMessage, skipping the server and
// worker lists: one client thread stands in for thousands of machines, each of which
// would parse its own copy in parallel, so a full parse here would measure the client.
bool ScanMetadata(const comm::Frame& f, uint64_t* epoch, int* state) {
  if (!f.payload) return false;
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(f.payload->data()),
                                            static_cast<int>(f.payload->size()));
  using WFL = google::protobuf::internal::WireFormatLite;
  for (uint32_t tag = in.ReadTag(); tag != 0; tag = in.ReadTag()) {
    const int field = WFL::GetTagFieldNumber(tag);
    uint64_t v = 0;
    if (field == 4 || field == 10) {
      if (!in.ReadVarint64(&v)) return false;
      if (field == 4) *state = static_cast<int>(v);
      if (field == 10) *epoch = v;
    } else if (!WFL::SkipField(&in, tag)) {
      return false;
    }
  }
  return true;
}

// Simulated nodes: one connection each, all on one client loop (loop thread state).
class SimNodes {
 public:
  struct Sim {
    ConnId conn = comm::kNoConn;
    std::string node_id;
    uint64_t epoch = 0;
    uint64_t seen_epoch = 0;  // newest epoch a heartbeat answer showed
    bool fetching = false;
    bool registered = false;
    bool ready = false;
    bool dead = false;
    Clock::time_point heard_death{};
  };

  SimNodes(int count, int servers, int sched_port) : port_(sched_port), servers_(servers), loop_("sim") {
    sims_.resize(count);
    for (int i = 0; i < count; ++i) sims_[i].node_id = "sim-" + std::to_string(i);
    comm::Messenger::Handlers h;
    h.on_request = [this](ConnId c, comm::Frame&& f) { OnPush(c, std::move(f)); };
    // One process stands for `count` machines, each of which would have a budget of its
    // own for frames received in part: the membership (about 60 bytes per member) arrives
    // on every link at once.
    comm::TransportOptions topt;
    topt.max_incomplete_frame_bytes = static_cast<uint64_t>(count) << 20;
    messenger_ = std::make_unique<comm::Messenger>(&loop_, topt, std::move(h));
    if (!loop_.Start().ok()) std::abort();
  }
  ~SimNodes() {
    OnLoop<int>(&loop_, [this] {
      if (beat_timer_ != 0) loop_.CancelTimer(beat_timer_);
      messenger_->Shutdown();
      return 0;
    });
    loop_.Stop().IgnoreError();
  }

  // Connects and registers every node; returns when all heard READY (or the deadline).
  // Sets the connect, register and ready times since the start.
  bool RegisterAll(Duration timeout, double* connect_ms, double* register_ms, double* ready_ms) {
    start_ = Clock::now();
    loop_.Post([this] {
      for (size_t i = 0; i < sims_.size(); ++i) Connect(i);
    });
    auto fut = all_ready_.get_future();
    if (fut.wait_for(timeout) != std::future_status::ready) {
      OnLoop<int>(&loop_, [this] {
        std::fprintf(stderr, "control_bench: %zu connected, %zu registered, %zu ready of %zu\n", connected_,
                     registered_, ready_count_, sims_.size());
        return 0;
      });
      return false;
    }
    *connect_ms = Ms(last_connect_ - start_);
    *register_ms = Ms(last_register_ - start_);
    *ready_ms = Ms(last_ready_ - start_);
    return true;
  }

  // Every registered node beats once per period, spread evenly over the period (nodes
  // beat from their registration on, as real ones do, so none times out while others join).
  void StartBeating(Duration period) {
    loop_.Post([this, period] {
      slot_ = period / static_cast<int>(sims_.size());
      next_beat_ = Clock::now();
      beat_timer_ = loop_.AddTimer(1ms, 1ms, [this] { BeatDue(); });
    });
  }

  // Node `i` stops beating now; returns when every other node heard of it (or deadline).
  // Sets death -> first and death -> last survivor hearing, in ms.
  bool Kill(size_t victim, Duration timeout, double* first_ms, double* last_ms) {
    Clock::time_point died = OnLoop<Clock::time_point>(&loop_, [this, victim] {
      victim_ = victim;
      sims_[victim].dead = true;
      return Clock::now();
    });
    auto fut = all_heard_.get_future();
    if (fut.wait_for(timeout) != std::future_status::ready) return false;
    Clock::time_point first = Clock::time_point::max(), last{};
    OnLoop<int>(&loop_, [&] {
      for (size_t i = 0; i < sims_.size(); ++i) {
        if (i == victim) continue;
        first = std::min(first, sims_[i].heard_death);
        last = std::max(last, sims_[i].heard_death);
      }
      return 0;
    });
    *first_ms = Ms(first - died);
    *last_ms = Ms(last - died);
    return true;
  }

  uint64_t beats_failed() const { return beats_failed_.load(); }
  struct Answers {
    uint64_t count = 0, bytes = 0, max_bytes = 0, fetches = 0, register_failures = 0;
  };
  Answers answers() {
    return OnLoop<Answers>(&loop_, [this] {
      return Answers{answers_, answer_bytes_, max_answer_bytes_, fetches_, register_failures_};
    });
  }

 private:
  void Connect(size_t i) {
    comm::ConnectOptions co;
    co.timeout = 30s;
    messenger_->transport().Connect("127.0.0.1", port_, co, [this, i](Result<ConnId> c) {
      if (!c.ok()) {
        std::fprintf(stderr, "control_bench: connect %zu failed: %s\n", i, c.status().ToString().c_str());
        return;
      }
      last_connect_ = Clock::now();
      ++connected_;
      sims_[i].conn = *c;
      by_conn_[*c] = i;
      Register(i);
    });
  }

  void Register(size_t i) {
    pb::RegisterMessage msg;
    msg.set_ip("127.0.0.1");
    msg.set_port(static_cast<int>(20000 + i % 40000));
    msg.set_node_id(sims_[i].node_id);
    const bool server = static_cast<int>(i) < servers_;
    msg.set_role(server ? pb::SERVER : pb::WORKER);
    msg.set_incarnation(i + 1);
    msg.set_protocol_version(node::kProtocolVersion);
    msg.set_requested_rank(-1);
    pb::Device* d = msg.add_devices();
    d->set_local_id(0);
    d->set_device_ip("10.0." + std::to_string(i / 250) + "." + std::to_string(i % 250));
    messenger_->Call(sims_[i].conn, node::MakeMeta(pb::REGISTER, msg.role(), -1), node::ToBuffer(msg), 30s,
                     [this, i](Result<comm::Frame> r) {
                       if (!r.ok()) {
                         ++register_failures_;
                         std::fprintf(stderr, "control_bench: register %zu: %s\n", i, r.status().ToString().c_str());
                         return;
                       }
                       last_register_ = Clock::now();
                       ++registered_;
                       sims_[i].registered = true;
                     });
  }

  void OnPush(ConnId c, comm::Frame&& f) {
    auto it = by_conn_.find(c);
    if (it == by_conn_.end()) return;
    Sim& s = sims_[it->second];
    bool ready = false;
    if (f.meta.cmd() == pb::SEND_METADATA) {
      uint64_t epoch = 0;
      int state = -1;
      if (!ScanMetadata(f, &epoch, &state)) return;
      s.epoch = std::max(s.epoch, epoch);
      ready = state == pb::CLUSTER_READY;
    } else if (f.meta.cmd() == pb::CLUSTER_EVENT) {
      pb::ClusterEventMessage ev;
      if (!node::ParsePayload(f, &ev).ok()) return;
      ready = ev.kind() == pb::ClusterEventMessage::STATE_CHANGED && ev.cluster_state() == pb::CLUSTER_READY;
      // Per-node notices may come coalesced: the first, then the others in `more`.
      bool victim = false;
      auto names_victim = [this](const pb::ClusterEventMessage& n) {
        return n.kind() == pb::ClusterEventMessage::NODE_TIMED_OUT && victim_ < sims_.size() &&
               n.node_id() == sims_[victim_].node_id;
      };
      victim = names_victim(ev);
      for (const pb::ClusterEventMessage& n : ev.more()) victim = victim || names_victim(n);
      if (victim && it->second != victim_ && s.heard_death == Clock::time_point{}) {
        s.heard_death = Clock::now();
        if (++heard_ == sims_.size() - 1) all_heard_.set_value();
      }
    }
    if (ready && !s.ready) {
      s.ready = true;
      last_ready_ = Clock::now();
      if (++ready_count_ == sims_.size()) all_ready_.set_value();
    }
  }

  // Beats every node whose slot came due, catching up after a late timer.
  void BeatDue() {
    const Clock::time_point now = Clock::now();
    while (next_beat_ <= now) {
      Sim& s = sims_[cursor_];
      if (!s.dead && s.registered) Beat(s);
      cursor_ = (cursor_ + 1) % sims_.size();
      next_beat_ += slot_;
    }
  }

  void Beat(Sim& s) {
    pb::HeartbeatMessage msg;
    msg.set_node_id(s.node_id);
    msg.set_node_state(pb::NODE_READY);
    msg.set_known_epoch(s.epoch);
    const size_t i = static_cast<size_t>(&s - sims_.data());
    msg.set_incarnation(i + 1);  // as registered (Register)
    messenger_->Call(s.conn, node::MakeMeta(pb::HEARTBEAT, pb::WORKER, -1), node::ToBuffer(msg), 2s,
                     [this, i](Result<comm::Frame> r) {
                       if (!r.ok()) {
                         ++beats_failed_;
                         return;
                       }
                       const uint64_t bytes = r->payload ? r->payload->size() : 0;
                       ++answers_;
                       answer_bytes_ += bytes;
                       max_answer_bytes_ = std::max(max_answer_bytes_, bytes);
                       pb::HeartbeatRespMessage resp;
                       if (!node::ParsePayload(*r, &resp).ok()) return;
                       Sim& s = sims_[i];
                       s.seen_epoch = std::max(s.seen_epoch, resp.epoch());
                       if (resp.epoch() > s.epoch && resp.cluster_state() != pb::ClUSTER_STARTING) Fetch(i);
                     });
  }

  // One fetch in flight per member; fetched again while a newer epoch was seen meanwhile.
  void Fetch(size_t i) {
    Sim& s = sims_[i];
    if (s.fetching) return;
    s.fetching = true;
    ++fetches_;
    messenger_->Call(s.conn, node::MakeMeta(pb::FETCH_METADATA, pb::WORKER, -1), nullptr, 10s,
                     [this, i](Result<comm::Frame> r) {
                       Sim& s = sims_[i];
                       s.fetching = false;
                       uint64_t epoch = 0;
                       int state = -1;
                       if (!r.ok() || !ScanMetadata(*r, &epoch, &state)) return;
                       const uint64_t before = s.epoch;
                       s.epoch = std::max(s.epoch, epoch);
                       if (s.epoch > before && s.epoch < s.seen_epoch) Fetch(i);
                     });
  }

  int port_;
  int servers_;
  comm::EventLoop loop_;
  std::unique_ptr<comm::Messenger> messenger_;
  std::vector<Sim> sims_;
  std::unordered_map<ConnId, size_t> by_conn_;
  Clock::time_point start_, last_connect_, last_register_, last_ready_;
  size_t ready_count_ = 0;
  size_t connected_ = 0;
  size_t registered_ = 0;
  std::promise<void> all_ready_;
  size_t victim_ = SIZE_MAX;
  size_t heard_ = 0;
  std::promise<void> all_heard_;
  comm::TimerId beat_timer_ = 0;
  Duration slot_{};
  Clock::time_point next_beat_;
  size_t cursor_ = 0;
  std::atomic<uint64_t> beats_failed_{0};
  uint64_t answers_ = 0;
  uint64_t answer_bytes_ = 0;
  uint64_t max_answer_bytes_ = 0;
  uint64_t fetches_ = 0;
  uint64_t register_failures_ = 0;
};

node::SchedulerOptions SchedOpts(int nodes, int servers, Duration timeout, bool whole_to_servers) {
  node::SchedulerOptions o;
  if (whole_to_servers) o.server_metadata_view_over = SIZE_MAX;
  o.worker_num = nodes - servers;
  o.server_num = servers;
  o.heartbeat_interval = 100ms;
  o.heartbeat_timeout = timeout;
  return o;
}

// A thread that spins on a core until destroyed: the competition a busy host gives the
// scheduler's loop thread.
class Burner {
 public:
  explicit Burner(bool on) {
    if (on) thread_ = std::thread([this] {
        volatile uint64_t x = 0;
        while (!stop_.load(std::memory_order_relaxed)) x = x * 6364136223846793005ull + 1;
      });
  }
  ~Burner() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

double PeakRssMb() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / 1024.0;  // KiB on Linux
}

// The members' side and the scheduler's side of one run, each in its own process when
// `split` (the fds of 10,000 members and of their 10,000 accepted links do not fit one
// process's hard open-file limit), or on two threads of one process. The two sides meet
// at the scheduler's port and at two points: the members report READY (the scheduler
// side then measures its CPU per heartbeat over the window), and the scheduler side
// lets the members go on to the death test.
// One direction between the two sides: a pipe when they are processes, else a queue.
class Channel {
 public:
  explicit Channel(bool split) : split_(split) {
    if (split_ && pipe(fds_) != 0) std::abort();
  }
  // After fork: the reading side closes the write end, the writing side the read end.
  void KeepReadEnd() { CloseEnd(1); }
  void KeepWriteEnd() { CloseEnd(0); }
  void Put(int64_t v) {
    if (!split_) {
      std::lock_guard<std::mutex> lock(mu_);
      values_.push_back(v);
      cv_.notify_all();
      return;
    }
    if (write(fds_[1], &v, sizeof(v)) != sizeof(v)) std::perror("control_bench: pipe write");
  }
  // One value, waited for up to `timeout`.
  bool Get(Duration timeout, int64_t* v) {
    if (!split_) {
      std::unique_lock<std::mutex> lock(mu_);
      if (!cv_.wait_for(lock, timeout, [this] { return !values_.empty(); })) return false;
      *v = values_.front();
      values_.erase(values_.begin());
      return true;
    }
    pollfd p{fds_[0], POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(ToMillis(timeout))) != 1) return false;
    return read(fds_[0], v, sizeof(*v)) == sizeof(*v);
  }

 private:
  void CloseEnd(int i) {
    if (split_ && fds_[i] >= 0) close(fds_[i]);
    fds_[i] = -1;
  }
  bool split_;
  int fds_[2] = {-1, -1};
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int64_t> values_;
};

struct Steps {
  explicit Steps(bool split) : split(split), to_sims(split), to_sched(split) {}
  bool split;
  Channel to_sims;   // the scheduler's port, then "go on"
  Channel to_sched;  // READY (or failed), then done (or failed)
};

constexpr int64_t kFailed = -1;

// The members: connect, register, READY, heartbeat answers, the death test.
int RunSims(int members, int servers, Steps* steps) {
  int64_t port = 0;
  if (!steps->to_sims.Get(120s, &port) || port <= 0) return 1;
  SimNodes sims(members, servers, static_cast<int>(port));
  sims.StartBeating(100ms);
  double connect_ms = 0, register_ms = 0, ready_ms = 0;
  const bool ready = sims.RegisterAll(60s, &connect_ms, &register_ms, &ready_ms);
  Print("register_failures", static_cast<double>(sims.answers().register_failures), "count");
  if (!ready) {
    std::fprintf(stderr, "control_bench: %d members did not all reach READY\n", members);
    std::fflush(stdout);
    steps->to_sched.Put(kFailed);
    return 1;
  }
  Print("register_connect_all", connect_ms, "ms");
  Print("register_all_registered", register_ms, "ms");
  Print("register_all_ready", ready_ms, "ms");
  std::fflush(stdout);
  steps->to_sched.Put(1);  // the scheduler side measures its CPU per heartbeat now
  int64_t go = 0;
  if (!steps->to_sims.Get(120s, &go) || go != 1) return 1;
  const SimNodes::Answers a = sims.answers();
  Print("heartbeat_answer_bytes_mean", a.count ? static_cast<double>(a.bytes) / a.count : 0.0, "bytes");
  Print("heartbeat_answer_bytes_max", static_cast<double>(a.max_bytes), "bytes");
  Print("metadata_fetches", static_cast<double>(a.fetches), "count");
  Print("heartbeats_failed", static_cast<double>(sims.beats_failed()), "count");
  double first_ms = 0, last_ms = 0;
  const bool heard = sims.Kill(static_cast<size_t>(members - 1), 10s, &first_ms, &last_ms);
  if (heard) {
    Print("death_to_first_survivor", first_ms, "ms");
    Print("death_to_last_survivor", last_ms, "ms");
  } else {
    std::fprintf(stderr, "control_bench: the survivors did not all hear of the death\n");
  }
  if (steps->split) Print("members_peak_rss", PeakRssMb(), "MiB");
  std::fflush(stdout);
  steps->to_sched.Put(heard ? 1 : kFailed);
  return heard ? 0 : 1;
}

// The scheduler: serves until the members are done; its CPU per heartbeat over the window.
int RunScheduler(int members, int servers, int window_s, bool whole_to_servers, Steps* steps) {
  // 2 s: the heartbeat timeout nodes are given by default is far longer; a storm of
  // registrations must not time out members that beat every 100 ms.
  node::SchedulerNode sched(SchedOpts(members, servers, 2s, whole_to_servers));
  if (!sched.Start().ok()) {
    steps->to_sims.Put(kFailed);
    return 1;
  }
  steps->to_sims.Put(sched.port());
  int64_t ready = 0;
  if (!steps->to_sched.Get(180s, &ready) || ready != 1) {
    Print(steps->split ? "scheduler_peak_rss" : "peak_rss", PeakRssMb(), "MiB");
    sched.Stop();
    return 1;
  }
  const uint64_t metadata_out = OnLoop<uint64_t>(sched.loop(), [&sched] {
    uint64_t bytes = 0;
    for (const comm::CommandStats& c : sched.messenger().transport().StatsByCommand()) {
      if (c.cmd == pb::SEND_METADATA || c.cmd == pb::FETCH_METADATA) bytes += c.bytes_out;
    }
    return bytes;
  });
  Print("metadata_bytes_to_ready", static_cast<double>(metadata_out) / (1 << 20), "MiB");
  std::this_thread::sleep_for(1s);  // warm-up: every member has beaten a few times
  auto sample = [&sched] {
    return OnLoop<std::pair<double, uint64_t>>(sched.loop(), [&sched] {
      return std::make_pair(ThreadCpuUs(), sched.heartbeats());
    });
  };
  const Clock::time_point t0 = Clock::now();
  auto [cpu0, hb0] = sample();
  std::this_thread::sleep_for(std::chrono::seconds(window_s));
  auto [cpu1, hb1] = sample();
  const double wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
  const double beats = static_cast<double>(hb1 - hb0);
  Print("heartbeats_per_s", beats / wall_s, "1/s");
  Print("scheduler_cpu_percent", (cpu1 - cpu0) / (wall_s * 1e4), "%");
  Print("scheduler_cpu_per_heartbeat", (cpu1 - cpu0) / beats, "us");
  uint64_t builds = OnLoop<uint64_t>(sched.loop(), [&sched] { return sched.metadata_builds(); });
  Print("metadata_builds", static_cast<double>(builds), "count");
  std::fflush(stdout);
  steps->to_sims.Put(1);
  int64_t done = 0;
  const bool ok = steps->to_sched.Get(60s, &done) && done == 1;
  Print(steps->split ? "scheduler_peak_rss" : "peak_rss", PeakRssMb(), "MiB");
  std::fflush(stdout);
  sched.Stop();
  return ok ? 0 : 1;
}

// Members in a child process when `split`, else on a thread of this one.
int Run(int members, int window_s, bool burner, bool whole_to_servers, bool split) {
  RaiseFdLimit((split ? 1 : 2) * static_cast<size_t>(members) + 64);
  const int servers = std::max(1, members / 8);
  std::printf("# %d members (%d servers), each on its own connection, burner %s, %s, servers get %s\n", members,
              servers, burner ? "on" : "off", split ? "members in a second process" : "one process",
              whole_to_servers ? "the whole membership" : "their view");
  std::fflush(stdout);
  Steps steps(split);
  if (split) {
    const pid_t child = fork();  // before any thread starts
    if (child < 0) return 1;
    if (child == 0) {
      steps.to_sims.KeepReadEnd();
      steps.to_sched.KeepWriteEnd();
      const int sims_rc = RunSims(members, servers, &steps);
      std::fflush(stdout);
      std::_Exit(sims_rc);
    }
    steps.to_sims.KeepWriteEnd();
    steps.to_sched.KeepReadEnd();
    int rc = 0;
    {
      Burner burn(burner);  // beside the scheduler
      rc = RunScheduler(members, servers, window_s, whole_to_servers, &steps);
    }
    int status = 0;
    // The child ends on its own once done or failed (each of its waits has a deadline).
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = 1;
    return rc;
  }
  Burner burn(burner);
  int sims_rc = 0;
  std::thread sims([&] { sims_rc = RunSims(members, servers, &steps); });
  const int rc = RunScheduler(members, servers, window_s, whole_to_servers, &steps);
  sims.join();
  return rc != 0 || sims_rc != 0 ? 1 : 0;
}

}  // namespace
}  // namespace pscore::bench

int main(int argc, char** argv) {
  int members = 2000, window_s = 5;
  int processes = 0;  // 0: two when one process cannot hold the fds of both ends
  bool burner = false;
  bool whole_to_servers = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&a] { return std::atoi(a.substr(a.find('=') + 1).c_str()); };
    if (a.rfind("--members=", 0) == 0) {
      members = val();
    } else if (a.rfind("--seconds=", 0) == 0) {
      window_s = val();
    } else if (a == "--burner") {
      burner = true;
    } else if (a == "--whole_to_servers") {
      whole_to_servers = true;
    } else if (a.rfind("--processes=", 0) == 0) {
      processes = val();
    } else {
      std::fprintf(stderr, "usage: control_bench [--members=2000] [--seconds=5] [--burner] [--whole_to_servers] "
                   "[--processes=1|2]\n");
      return 2;
    }
  }
  if (members < 2 || window_s < 1) {
    std::fprintf(stderr, "control_bench: --members must be >= 2 and --seconds >= 1\n");
    return 2;
  }
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = false;
  FLAGS_stderrthreshold = 2;  // ERROR: the scheduler's INFO lines go to glog's log file, as in production
  if (processes == 0) {
    rlimit rl{};
    getrlimit(RLIMIT_NOFILE, &rl);
    processes = rl.rlim_max != RLIM_INFINITY && rl.rlim_max < 2 * static_cast<rlim_t>(members) + 64 ? 2 : 1;
  }
  if (processes != 1 && processes != 2) {
    std::fprintf(stderr, "control_bench: --processes must be 1 or 2\n");
    return 2;
  }
  return pscore::bench::Run(members, window_s, burner, whole_to_servers, processes == 2);
}
