// Busy-waiting for something another thread makes true within microseconds (a helper thread's
// progress on the same query): a pause between reads, and a yield every 64 so that on a 2-vCPU
// machine the thread being waited for gets the CPU.
#pragma once

#include <thread>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kvo {

inline void CpuRelax() {
#if defined(__x86_64__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

template <typename F>
void SpinUntil(F done) {
  for (int spins = 0; !done(); ++spins) {
    if (spins % 64 == 63) {
      std::this_thread::yield();
    } else {
      CpuRelax();
    }
  }
}

}  // namespace kvo
