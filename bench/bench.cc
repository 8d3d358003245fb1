#include "bench/bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>

#include <nlohmann/json.hpp>

namespace kvo::bench {

void PrintResult(const BenchResult& r, const BenchOptions& options) {
  double ratio = r.baseline > 0 ? r.value / r.baseline : 0.0;
  if (options.json) {
    nlohmann::json j = {{"area", r.area},         {"case", r.name},
                        {"unit", r.unit},         {"value", r.value},
                        {"baseline", r.baseline}, {"baseline_name", r.baseline_name},
                        {"ratio", ratio}};
    if (r.target > 0) {
      j["target"] = r.target;
      j["meets_target"] = r.value >= r.target;
    }
    if (!r.notes.empty()) j["notes"] = r.notes;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%-8s %-34s %14.0f %-16s baseline %14.0f (%s)  ratio %.2f%s\n", r.area.c_str(),
                r.name.c_str(), r.value, r.unit.c_str(), r.baseline, r.baseline_name.c_str(), ratio,
                r.target > 0 ? (r.value >= r.target ? "  [target met]" : "  [below target]") : "");
  }
  std::fflush(stdout);
}

double MeasureRate(const std::function<void()>& op, double items, double seconds) {
  using Clock = std::chrono::steady_clock;
  double best = 0;
  for (int round = 0; round < 3; ++round) {
    auto start = Clock::now();
    uint64_t calls = 0;
    double elapsed = 0;
    do {
      op();
      ++calls;
      elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    } while (elapsed < seconds / 3);
    best = std::max(best, static_cast<double>(calls) * items / elapsed);
  }
  return best;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t idx = static_cast<size_t>(p / 100.0 * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(idx, v.size() - 1)];
}

namespace {
std::mutex& RegistryMutex() {
  static std::mutex mu;
  return mu;
}
std::multimap<std::string, BenchCases>& Registry() {
  static std::multimap<std::string, BenchCases> registry;
  return registry;
}
}  // namespace

void RegisterBenchCases(std::string area, BenchCases cases) {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  Registry().emplace(std::move(area), std::move(cases));
}

bool HasRegisteredBenchCases(const std::string& area) {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  return Registry().count(area) > 0;
}

int RunRegisteredBenchCases(const std::string& area, const BenchOptions& options) {
  std::vector<BenchCases> sets;
  {
    std::lock_guard<std::mutex> lock(RegistryMutex());
    auto [begin, end] = Registry().equal_range(area);
    for (auto it = begin; it != end; ++it) sets.push_back(it->second);
  }
  int rc = 0;
  for (const auto& cases : sets) rc |= cases(options);
  return rc;
}

}  // namespace kvo::bench
