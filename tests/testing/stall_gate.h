// StallGate: holds a helper thread at a test hook, as a host that takes its CPU away would hold
// it, with a watchdog that lets it go after a bound so that code which waits for the held thread
// fails its test instead of hanging it. Thread-safe.
//
//   gate.Hold(3);            // the hook's 3rd call from now on blocks
//   gate.StartWatchdog();    // ... the code under test, which must not wait for the helper ...
//   EXPECT_FALSE(gate.StopWatchdog()) << "it waited";
//   gate.Release();
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace kvo::testing {

class StallGate {
 public:
  ~StallGate() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      hold_ = false;
      watching_ = false;
      cv_.notify_all();
    }
    if (watchdog_.joinable()) watchdog_.join();
  }

  // From now on the hook's `at_call`-th call blocks until Release (or the watchdog).
  void Hold(int at_call = 1) {
    std::lock_guard<std::mutex> lock(mu_);
    hold_ = true;
    at_call_ = at_call;
    calls_ = 0;
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    hold_ = false;
    cv_.notify_all();
  }

  // The hook, on the helper's thread.
  void Hook() {
    std::unique_lock<std::mutex> lock(mu_);
    if (!hold_ || ++calls_ != at_call_) return;
    cv_.notify_all();  // WaitHeld
    cv_.wait(lock, [this] { return !hold_; });
  }

  // Waits (at most `limit`) until the hook holds the thread; false when it never did.
  bool WaitHeld(std::chrono::seconds limit = std::chrono::seconds(20)) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, limit, [this] { return calls_ >= at_call_; });
  }
  // The hook's calls while held, since Hold.
  int Calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }

  // Releases the held thread after `limit` unless StopWatchdog comes first.
  void StartWatchdog(std::chrono::seconds limit = std::chrono::seconds(20)) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      watching_ = true;
      fired_ = false;
    }
    watchdog_ = std::thread([this, limit] {
      std::unique_lock<std::mutex> lock(mu_);
      if (!cv_.wait_for(lock, limit, [this] { return !watching_; })) {
        fired_ = true;
        hold_ = false;
        cv_.notify_all();
      }
    });
  }
  // Stops the watchdog; true when it had to release the thread (the code under test waited).
  bool StopWatchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      watching_ = false;
      cv_.notify_all();
    }
    watchdog_.join();
    std::lock_guard<std::mutex> lock(mu_);
    return fired_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool hold_ = false;
  int at_call_ = 1;
  int calls_ = 0;  // the hook's calls since Hold
  bool watching_ = false;
  bool fired_ = false;
  std::thread watchdog_;
};

}  // namespace kvo::testing
