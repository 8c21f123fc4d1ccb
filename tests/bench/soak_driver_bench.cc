// soak_driver: the worker of scripts/soak.sh. Registers as a worker (a WorkerNode) and
// pushes +1 to every one of --keys keys, spread over the key space, one batch at a time,
// until <dir>/stop exists. Before each push it appends one byte to <dir>/<node_id>.sent,
// after an acknowledged push one byte to <dir>/<node_id>.acked (a SIGKILL between the
// answer and the write only undercounts acks, which keeps the check sound). Then it writes
// <dir>/<node_id>.done. With --check it also waits for the .done file of every --peers id,
// pulls the keys and compares each value with the counts of all drivers:
//   acked pushes <= value <= sent pushes   (below: a lost update; above: a duplicate)
// prints one summary line and exits 0 if nothing was lost or duplicated, else 1.
// With --floats=N every key holds N floats (all must hold the same value: a key seen half
// pushed counts as torn, and fails the check); keys of 64 KiB or more go by ZPush, which a
// server without --data_dir folds into its store as the values arrive.
// Flags: --scheduler_port=P --node_id=ID --dir=D [--keys=64] [--floats=1] [--pause_us=300]
//        [--check --peers=w0,w1] [--heartbeat_interval_ms=200] [--connect_timeout_ms=30000]
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "pscore/core/kv_codec.h"
#include "pscore/node/worker/worker_node.h"

namespace {

using namespace std::chrono_literals;
using pscore::Status;

std::map<std::string, std::string> ParseArgs(int argc, char** argv) {
  std::map<std::string, std::string> out;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0) continue;
    size_t eq = a.find('=');
    out[a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2)] =
        eq == std::string::npos ? "true" : a.substr(eq + 1);
  }
  return out;
}

bool Exists(const std::string& p) { return std::filesystem::exists(p); }

void AppendByte(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd < 0) return;
  ssize_t n = ::write(fd, "x", 1);
  (void)n;
  ::close(fd);
}

uint64_t CountBytes(const std::string& path) {
  std::error_code ec;
  uint64_t n = std::filesystem::file_size(path, ec);
  return ec ? 0 : n;
}

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> args = ParseArgs(argc, argv);
  auto get = [&args](const std::string& k, const std::string& def) {
    auto it = args.find(k);
    return it == args.end() ? def : it->second;
  };
  const std::string dir = get("dir", "");
  const std::string id = get("node_id", "");
  if (dir.empty() || id.empty() || get("scheduler_port", "").empty()) {
    std::fprintf(stderr, "usage: soak_driver --scheduler_port=P --node_id=ID --dir=D [--keys=N] [--check --peers=a,b]\n");
    return 2;
  }
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;

  pscore::node::NodeOptions o;
  o.role = pscore::pb::WORKER;
  o.node_id = id;
  o.scheduler_port = std::atoi(get("scheduler_port", "0").c_str());
  o.heartbeat_interval = std::chrono::milliseconds(std::atoi(get("heartbeat_interval_ms", "200").c_str()));
  o.connect_timeout = std::chrono::milliseconds(std::atoi(get("connect_timeout_ms", "30000").c_str()));
  o.request_timeout = 30s;
  pscore::node::WorkerNode worker(o);
  Status st = worker.Start();
  if (st.ok()) st = worker.WaitForReady(o.connect_timeout);
  if (!st.ok()) {
    std::fprintf(stderr, "soak_driver %s: %s\n", id.c_str(), st.ToString().c_str());
    return 1;
  }

  const int nkeys = std::atoi(get("keys", "64").c_str());
  std::vector<uint64_t> keys;
  for (int i = 0; i < nkeys; ++i) keys.push_back(static_cast<uint64_t>(i) * (UINT64_MAX / nkeys) + 7);
  const uint32_t floats = static_cast<uint32_t>(std::max(1, std::atoi(get("floats", "1").c_str())));
  auto ones = std::make_shared<const std::vector<float>>(keys.size() * floats, 1.0f);
  const bool zero_copy = uint64_t{floats} * sizeof(float) >= pscore::core::kZeroCopyBytes;
  // Paced so a long soak stays below 2^24 pushes per key (float sums stay exact).
  const auto pause = std::chrono::microseconds(std::atoi(get("pause_us", "300").c_str()));
  uint64_t acked = 0, failed = 0;
  while (!Exists(dir + "/stop")) {
    AppendByte(dir + "/" + id + ".sent");
    Status push = (zero_copy ? worker.ZPush(keys, ones) : worker.Push(keys, *ones)).get();
    if (push.ok()) {
      AppendByte(dir + "/" + id + ".acked");
      ++acked;
      std::this_thread::sleep_for(pause);
    } else {
      ++failed;
      LOG(WARNING) << id << ": push failed (counted as sent, not acknowledged): " << push;
      std::this_thread::sleep_for(100ms);
    }
  }
  LOG(INFO) << id << ": stop: " << acked << " pushes acknowledged, " << failed << " failed in this run";
  AppendByte(dir + "/" + id + ".done");

  int code = 0;
  if (args.count("check") != 0) {
    std::vector<std::string> peers = Split(get("peers", id));
    const auto deadline = std::chrono::steady_clock::now() + 120s;
    for (const std::string& p : peers) {
      while (!Exists(dir + "/" + p + ".done") && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(50ms);
      }
    }
    uint64_t sent_total = 0, acked_total = 0;
    for (const std::string& p : peers) {
      sent_total += CountBytes(dir + "/" + p + ".sent");
      acked_total += CountBytes(dir + "/" + p + ".acked");
    }
    pscore::Result<pscore::node::PullResult> pulled = worker.Pull(keys).get();
    for (int attempt = 0; !pulled.ok() && attempt < 20; ++attempt) {
      std::this_thread::sleep_for(500ms);
      pulled = worker.Pull(keys).get();
    }
    if (!pulled.ok()) {
      std::printf("soak check: pull failed: %s\n", pulled.status().ToString().c_str());
      code = 1;
    } else if (pulled->values.size() != keys.size() * floats) {
      std::printf("soak check: pulled %zu floats, expected %zu\n", pulled->values.size(), keys.size() * floats);
      code = 1;
    } else {
      uint64_t lost = 0, duplicated = 0, torn = 0;
      double vmin = 1e300, vmax = 0;
      for (size_t k = 0; k < keys.size(); ++k) {
        const float* key_values = pulled->values.data() + k * floats;
        if (std::any_of(key_values, key_values + floats, [&](float x) { return x != key_values[0]; })) ++torn;
        const double d = key_values[0];
        vmin = std::min(vmin, d);
        vmax = std::max(vmax, d);
        if (d < static_cast<double>(acked_total)) lost += acked_total - static_cast<uint64_t>(d);
        if (d > static_cast<double>(sent_total)) duplicated += static_cast<uint64_t>(d) - sent_total;
      }
      std::printf("soak check: keys %d, pushes acknowledged %llu, sent %llu, per-key value min %.0f max %.0f, "
                  "lost updates %llu, duplicated updates %llu, torn keys %llu\n",
                  nkeys, static_cast<unsigned long long>(acked_total), static_cast<unsigned long long>(sent_total),
                  vmin, vmax, static_cast<unsigned long long>(lost), static_cast<unsigned long long>(duplicated),
                  static_cast<unsigned long long>(torn));
      if (sent_total >= (1u << 24)) std::printf("soak check: over 2^24 pushes: float sums are no longer exact\n");
      code = lost == 0 && duplicated == 0 && torn == 0 && acked_total > 0 ? 0 : 1;
    }
    std::fflush(stdout);
  }
  worker.Stop();
  return code;
}
