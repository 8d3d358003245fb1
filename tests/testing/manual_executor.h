// ManualExecutor: an Executor (common/thread_pool.h) whose scheduled work runs only when a test
// says so, in the order the test picks — to drive asynchronous backends (the host transfer
// engine's copy pieces, ...) through interleavings deterministically, without sleeps.
// Thread-safe: Schedule may be called from any thread; a task runs on the caller of Run*.
#pragma once

#include <cstddef>
#include <functional>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "common/thread_pool.h"

namespace kvo::testing {

class ManualExecutor final : public Executor {
 public:
  void Schedule(std::function<void()> fn) override {
    MutexLock lock(&mu_);
    tasks_.push_back(std::move(fn));
  }

  // Tasks scheduled and not yet run.
  size_t pending() {
    MutexLock lock(&mu_);
    return tasks_.size();
  }

  // Runs the pending task at `index` (0: the oldest); false when there is none.
  bool RunAt(size_t index) {
    std::function<void()> fn;
    {
      MutexLock lock(&mu_);
      if (index >= tasks_.size()) return false;
      fn = std::move(tasks_[index]);
      tasks_.erase(tasks_.begin() + static_cast<std::ptrdiff_t>(index));
    }
    fn();
    return true;
  }
  bool RunNext() { return RunAt(0); }
  bool RunLast() {
    const size_t n = pending();
    return n > 0 && RunAt(n - 1);
  }

  // Runs tasks, oldest first, until none is pending (including tasks they schedule). Returns how
  // many ran.
  size_t RunAll() {
    size_t n = 0;
    while (RunNext()) ++n;
    return n;
  }

 private:
  Mutex mu_;
  std::vector<std::function<void()>> tasks_ GUARDED_BY(mu_);
};

}  // namespace kvo::testing
