// Clock seam: production code asks a Clock for the time so tests can drive it (ManualClock in
// tests/testing). Implementations are thread-safe.
#pragma once

#include <cstdint>

namespace kvo {

class Clock {
 public:
  virtual ~Clock() = default;
  // Wall-clock time, microseconds since the Unix epoch (event timestamps).
  virtual int64_t NowMicros() = 0;
  // Monotonic time in nanoseconds, for durations and timeouts.
  virtual int64_t MonotonicNanos() = 0;
  double NowSeconds() { return static_cast<double>(NowMicros()) / 1e6; }
};

// The process-wide real clock. Never null; never deleted.
Clock* SystemClock();

}  // namespace kvo
