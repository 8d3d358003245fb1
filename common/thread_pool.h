// Executor seam and a fixed-size ThreadPool. Tests use ManualExecutor (tests/testing) to run
// scheduled work deterministically. Both are thread-safe.
#pragma once

#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"

namespace kvo {

class Executor {
 public:
  virtual ~Executor() = default;
  // Runs `fn` at some later time, on some thread. Never blocks on the work itself.
  virtual void Schedule(std::function<void()> fn) = 0;
};

class ThreadPool final : public Executor {
 public:
  // Starts `num_threads` (>= 1) workers named `name`.
  ThreadPool(int num_threads, const std::string& name);
  // Runs every task already scheduled, then joins the workers.
  ~ThreadPool() override;
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void Schedule(std::function<void()> fn) override;
  // Blocks until every task scheduled so far has finished.
  void WaitIdle();

 private:
  void WorkerLoop();

  Mutex mu_;
  CondVar work_cv_{&mu_};
  CondVar idle_cv_{&mu_};
  std::deque<std::function<void()>> queue_ GUARDED_BY(mu_);
  int active_ GUARDED_BY(mu_) = 0;
  bool stopping_ GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace kvo
