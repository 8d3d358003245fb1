// An annotated mutex (leveldb port::Mutex pattern) so clang's -Wthread-safety checks GUARDED_BY.
#pragma once

#include <condition_variable>
#include <mutex>
#include <shared_mutex>

#include "common/thread_annotations.h"

namespace kvo {

class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  std::mutex& native() { return mu_; }

 private:
  std::mutex mu_;
};

class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() RELEASE() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// Condition variable bound to a Mutex. REQUIRES: the mutex is held by the caller of Wait.
class CondVar {
 public:
  explicit CondVar(Mutex* mu) : mu_(mu) {}
  void Wait() NO_THREAD_SAFETY_ANALYSIS {
    std::unique_lock<std::mutex> lock(mu_->native(), std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  template <class Duration>
  void WaitFor(Duration d) NO_THREAD_SAFETY_ANALYSIS {
    std::unique_lock<std::mutex> lock(mu_->native(), std::adopt_lock);
    cv_.wait_for(lock, d);
    lock.release();
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  Mutex* const mu_;
  std::condition_variable cv_;
};

// An annotated reader/writer lock: writers take WriterLock, readers ReaderLock (shared).
class CAPABILITY("mutex") SharedMutex {
 public:
  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  void LockShared() KVO_THREAD_ANNOTATION_(acquire_shared_capability()) { mu_.lock_shared(); }
  void UnlockShared() KVO_THREAD_ANNOTATION_(release_shared_capability()) { mu_.unlock_shared(); }

 private:
  std::shared_mutex mu_;
};
class SCOPED_CAPABILITY WriterLock {
 public:
  explicit WriterLock(SharedMutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~WriterLock() RELEASE() { mu_->Unlock(); }

 private:
  SharedMutex* const mu_;
};
class SCOPED_CAPABILITY ReaderLock {
 public:
  explicit ReaderLock(SharedMutex* mu) KVO_THREAD_ANNOTATION_(acquire_shared_capability(mu))
      : mu_(mu) {
    mu_->LockShared();
  }
  ~ReaderLock() KVO_THREAD_ANNOTATION_(release_capability()) { mu_->UnlockShared(); }

 private:
  SharedMutex* const mu_;
};

}  // namespace kvo
