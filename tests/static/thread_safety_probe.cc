// Proves the clang build checks lock annotations: tests/CMakeLists.txt compiles this file twice
// with -Wthread-safety -Werror; with KVO_PROBE_VIOLATION it must be rejected for the unlocked
// write, without it it must compile (so the rejection is the analysis, not a broken include).
#include "common/mutex.h"

namespace {

class Counter {
 public:
  void Add() {
#ifdef KVO_PROBE_VIOLATION
    ++value_;
#else
    kvo::MutexLock lock(&mu_);
    ++value_;
#endif
  }

 private:
  kvo::Mutex mu_;
  int value_ GUARDED_BY(mu_) = 0;
};

}  // namespace

int main() {
  Counter c;
  c.Add();
  return 0;
}
