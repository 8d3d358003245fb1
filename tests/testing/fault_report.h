// Fault-suite records: every fault test reports what it did (fault, trials, what was checked,
// failures, seed) so tests/faults/run can build RELIABILITY.md from the runs themselves.
#pragma once

#include <cstdint>
#include <string>

#include "tests/testing/sanitizers.h"

namespace kvo::testing {

struct FaultRecord {
  std::string area;      // "indexer", "bus", "file tier", "journal", "http", "engine", "network"
  std::string fault;     // what was done, e.g. "kill -9 of the indexer mid-apply"
  int64_t trials = 0;    // how many times
  std::string checked;   // what was verified after each trial
  int64_t failures = 0;  // trials where the check failed (0 for a passing test)
  uint64_t seed = 0;     // replay with KVO_TEST_SEED=seed
  std::string figures;   // optional measured figures, e.g. "healthz p99 3.1 ms"
};

// Prints one "[ fault ] ..." line and, when $KVO_FAULT_REPORT_DIR is set, appends the record as
// one JSON line to $KVO_FAULT_REPORT_DIR/faults.jsonl (O_APPEND: tests running in parallel).
void ReportFault(const FaultRecord& record);

// Trial counts: `quick` unless $KVO_FAULTS=long (tests/faults/run --long), then `long_run`.
int FaultTrials(int quick, int long_run);

// True under tests/faults/run --long.
bool LongFaultRun();

// Whether this build asserts wall-clock latency promises (e.g. /healthz within 100 ms). False
// under ThreadSanitizer, which slows every memory access of the daemon several times over: there
// the latencies are measured and reported, and the correctness checks still hold.
constexpr bool LatencyAsserted() { return !kThreadSanitizer; }

// Whether this build asserts memory promises (RSS flat under churn): false under ThreadSanitizer,
// whose shadow memory and access history grow with the daemon's activity.
constexpr bool MemoryAsserted() { return LatencyAsserted(); }

}  // namespace kvo::testing
