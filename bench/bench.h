// Benchmark reporting: every case prints its figure, a baseline measured in the same run, and the
// ratio figure/baseline (higher is better for throughputs). One JSON object per line with --json.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace kvo::bench {

struct BenchResult {
  std::string area;           // "events"
  std::string name;           // "encode_16_blocks"
  std::string unit;           // "block_events/s"
  double value = 0;           // the figure
  std::string baseline_name;  // what the baseline is
  double baseline = 0;        // the baseline figure, same unit, same run
  double target = 0;          // target from ARCHITECTURE.md §5 in the same unit (0: none)
  std::string notes;
};

struct BenchOptions {
  bool json = false;
  double seconds_per_case = 0.5;  // time budget for each measured loop
  bool quick = false;             // CI smoke mode: tiny budgets
  // --only: run the case groups whose name contains this ("" = all). Groups: events: hash_chain,
  // codec, pubsub, lag, restart, journal; indexer: ingest, score, router; fs: each case's name
  // (2MiB_blocks_buffered, 2MiB_blocks_odirect, 64KiB_blocks_buffered).
  std::string only;
  bool Wants(std::string_view group) const {
    return only.empty() || group.find(only) != std::string_view::npos;
  }
};

void PrintResult(const BenchResult& result, const BenchOptions& options);

// Runs `op` repeatedly (each call does `items` units of work) for about `seconds`; returns the
// best-of-3 items per second.
double MeasureRate(const std::function<void()>& op, double items, double seconds);

// Percentile (0..100) of a sample (copied and sorted).
double Percentile(std::vector<double> v, double p);

// Areas; each prints its cases and returns 0, or 1 when a case could not run.
int RunEventsBench(const BenchOptions& options);
int RunJournalBench(const BenchOptions& options);  // bench/journal_bench.cc
int RunManagerBench(const BenchOptions& options);  // bench/manager_bench.cc
int RunIndexerBench(const BenchOptions& options);  // bench/indexer_bench.cc
// bench/transfer_bench.cc: all transfer cases; the host engine's cases alone.
int RunTransferBench(const BenchOptions& options);
int RunHostTransferCases(const BenchOptions& options);
// bench/staging_plan_bench.cc: the CUDA staging submit's host-side planning (no GPU needed).
int RunStagingPlanCases(const BenchOptions& options);
// bench/fs_bench.cc
int RunFsBench(const BenchOptions& options);
// bench/route_bench.cc: kvo route's added latency against a direct request.
int RunRouteBench(const BenchOptions& options);

// Cases an optional library adds to an area (the GPU cases of `transfer`, from
// transfer/cuda when it is linked): they run after the area's own cases. Thread-safe.
using BenchCases = std::function<int(const BenchOptions&)>;
void RegisterBenchCases(std::string area, BenchCases cases);
bool HasRegisteredBenchCases(const std::string& area);
// Runs every registered set for `area`; 0 when all ran (or none is registered), else 1.
int RunRegisteredBenchCases(const std::string& area, const BenchOptions& options);

}  // namespace kvo::bench
