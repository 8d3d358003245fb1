#include "common/thread_pool.h"

#include <pthread.h>

#include <algorithm>

namespace kvo {

ThreadPool::ThreadPool(int num_threads, const std::string& name) {
  num_threads = std::max(1, num_threads);
  threads_.reserve(static_cast<size_t>(num_threads));
  for (int i = 0; i < num_threads; ++i) {
    threads_.emplace_back([this] { WorkerLoop(); });
    std::string thread_name = name.substr(0, 12) + "-" + std::to_string(i);
    pthread_setname_np(threads_.back().native_handle(), thread_name.c_str());
  }
}

ThreadPool::~ThreadPool() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  work_cv_.SignalAll();
  for (auto& t : threads_) t.join();
}

void ThreadPool::Schedule(std::function<void()> fn) {
  {
    MutexLock lock(&mu_);
    queue_.push_back(std::move(fn));
  }
  work_cv_.Signal();
}

void ThreadPool::WaitIdle() {
  MutexLock lock(&mu_);
  while (!queue_.empty() || active_ > 0) idle_cv_.Wait();
}

void ThreadPool::WorkerLoop() {
  while (true) {
    std::function<void()> fn;
    {
      MutexLock lock(&mu_);
      while (queue_.empty() && !stopping_) work_cv_.Wait();
      if (queue_.empty()) return;  // stopping and drained
      fn = std::move(queue_.front());
      queue_.pop_front();
      ++active_;
    }
    fn();
    {
      MutexLock lock(&mu_);
      --active_;
      if (queue_.empty() && active_ == 0) idle_cv_.SignalAll();
    }
  }
}

}  // namespace kvo
