// ManualClock: a Clock that only moves when a test says so. Thread-safe.
#pragma once

#include <atomic>

#include "common/clock.h"

namespace kvo::testing {

class ManualClock final : public Clock {
 public:
  explicit ManualClock(int64_t start_micros = 1'700'000'000'000'000) : micros_(start_micros) {}
  int64_t NowMicros() override { return micros_.load(); }
  int64_t MonotonicNanos() override { return micros_.load() * 1000; }
  void AdvanceMicros(int64_t d) { micros_ += d; }

 private:
  std::atomic<int64_t> micros_;
};

}  // namespace kvo::testing
