// What the figure-printing benchmarks share: one figure per line (`name value unit`,
// which scripts/plot_dataplane.sh and readers split on whitespace), size names, seconds
// of a duration, a bounded wait on a future, `--name=N` flags and the binary's directory.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <string>
#include <vector>

#include <glog/logging.h>

namespace pscore::bench {

inline double Seconds(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }

inline void Print(const std::string& name, double value, const char* unit, int decimals = 2) {
  std::printf("%-40s %12.*f %s\n", name.c_str(), decimals, value, unit);
  std::fflush(stdout);
}

// The q-quantile (0 <= q <= 1) of the samples, interpolated linearly between the two
// nearest of them in sorted order (numpy's default: the median of an even count is the
// mean of the middle two); 0 for none. Reorders *v.
inline double Quantile(std::vector<double>* v, double q) {
  if (v->empty()) return 0;
  const double pos = std::clamp(q, 0.0, 1.0) * static_cast<double>(v->size() - 1);
  const auto below = static_cast<std::ptrdiff_t>(pos);
  const auto at = v->begin() + below;
  std::nth_element(v->begin(), at, v->end());
  if (at + 1 == v->end()) return *at;
  const double above = *std::min_element(at + 1, v->end());
  return *at + (pos - static_cast<double>(below)) * (above - *at);
}

inline double Median(std::vector<double> v) { return Quantile(&v, 0.5); }

inline std::string SizeName(size_t size) {
  if (size >= (1u << 20)) return std::to_string(size >> 20) + "MiB";
  if (size >= (1u << 10)) return std::to_string(size >> 10) + "KiB";
  return std::to_string(size) + "B";
}

// The future's value; a benchmark that waits longer than `limit` is stuck and aborts.
template <typename T>
T Wait(std::future<T>& f, std::chrono::minutes limit = std::chrono::minutes(10)) {
  CHECK(f.wait_for(limit) == std::future_status::ready) << "benchmark stuck";
  return f.get();
}

// The value of `--name=N` among the arguments, or `fallback`.
inline int IntFlag(int argc, char** argv, const std::string& name, int fallback) {
  const std::string prefix = "--" + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]).rfind(prefix, 0) == 0) return std::atoi(argv[i] + prefix.size());
  }
  return fallback;
}

// The directory of this binary (where the build put pscore-node beside it); "." if unknown.
inline std::string SelfDir() {
  std::error_code ec;
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : self.parent_path().string();
}

}  // namespace pscore::bench
