#include "indexer/service/key_helper.h"

#include <span>

#include "indexer/indexer.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kvo {
namespace {

inline void CpuRelax() {
#if defined(__x86_64__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// Spins on `done` with a pause, yielding the CPU every so often (on a 2-vCPU machine the other
// side may need this one).
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

}  // namespace

KeyHelper::KeyHelper(const Indexer* index) : index_(index), thread_([this] { Run(); }) {}

KeyHelper::~KeyHelper() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  thread_.join();
}

std::unique_ptr<KeyHelper::Lease> KeyHelper::TryLease() {
  bool expected = false;
  if (!leased_.compare_exchange_strong(expected, true, std::memory_order_acquire)) return nullptr;
  return std::make_unique<Lease>(this);
}

void KeyHelper::Run() {
  for (;;) {
    size_t block_size;
    uint64_t parent;
    uint64_t generation;
    {
      MutexLock lock(&mu_);
      while (!posted_ && !stop_) cv_.Wait();
      if (stop_) return;
      posted_ = false;
      block_size = block_size_;
      parent = root_;
      generation = generation_;
    }
    uint64_t unclaimed = generation << 2 | kUnclaimed;
    if (!claim_.compare_exchange_strong(unclaimed, generation << 2 | kHelper,
                                        std::memory_order_acq_rel)) {
      continue;  // the lease took the job back (or a newer one is posted)
    }
    keys_.clear();
    keys_complete_ = false;
    walked_.reset();
    // The walk takes the index's reader lock here, on this thread, and gives it back below.
    std::unique_ptr<Indexer::TieredWalk> walk =
        index_ != nullptr ? index_->StartTieredWalk() : nullptr;
    const bool walking = walk != nullptr;
    size_t blocks = 0;  // hashed
    size_t walked = 0;  // of those, walked
    for (;;) {
      // `end_` before `avail_`: once the list is complete, the count read after it is final.
      const int end = end_.load(std::memory_order_acquire);
      const size_t n = avail_.load(std::memory_order_acquire);
      const int64_t* data = data_.load(std::memory_order_acquire);
      if (end == kCancelled) break;
      if ((blocks + 1) * block_size <= n) {
        // Hash what is there first (a few blocks at a time, so a cancel is seen soon): the chain
        // is the longer of the two jobs and only this thread can do it.
        for (int i = 0; i < 64 && (blocks + 1) * block_size <= n; ++i, ++blocks) {
          parent =
              ContentKey(parent, std::span<const int64_t>(data + blocks * block_size, block_size));
          keys_.push_back(parent);
        }
        continue;
      }
      if (walking && walked < blocks) {
        // Waiting for tokens (or at the end): walk the keys hashed so far.
        const size_t step = std::min<size_t>(64, blocks - walked);
        if (!walk->Walk(std::span<const uint64_t>(keys_.data() + walked, step))) {
          break;  // the walk is over: no later key changes the answer
        }
        walked += step;
        continue;
      }
      if (end == kComplete) {
        keys_complete_ = true;
        break;
      }
      SpinUntil([&] {
        return end_.load(std::memory_order_acquire) != kOpen ||
               avail_.load(std::memory_order_acquire) >= (blocks + 1) * block_size;
      });
    }
    // A cancelled job's walk is dropped (its destructor gives the lock back).
    if (walking && end_.load(std::memory_order_acquire) != kCancelled) walked_ = walk->Finish();
    walk.reset();
    jobs_done_.fetch_add(1, std::memory_order_relaxed);
    finished_.store(generation, std::memory_order_release);
  }
}

void KeyHelper::Lease::Begin(int64_t block_size, std::string_view lora_name) {
  KeyHelper& h = *helper_;
  h.data_.store(nullptr, std::memory_order_relaxed);
  h.avail_.store(0, std::memory_order_relaxed);
  h.end_.store(kOpen, std::memory_order_relaxed);
  {
    MutexLock lock(&h.mu_);  // publishes the above and the job to the helper
    h.block_size_ = static_cast<size_t>(block_size);
    h.root_ = ContentKeyRoot(lora_name);
    generation_ = ++h.generation_;
    h.claim_.store(generation_ << 2 | kUnclaimed, std::memory_order_release);
    h.posted_ = true;
  }
  h.cv_.Signal();
}

void KeyHelper::Lease::Tokens(const int64_t* data, size_t n) {
  helper_->data_.store(data, std::memory_order_release);
  helper_->avail_.store(n, std::memory_order_release);
}

void KeyHelper::Lease::End(bool ok) {
  if (generation_ == 0 || ended_) return;
  ended_ = true;
  KeyHelper& h = *helper_;
  h.end_.store(ok ? kComplete : kCancelled, std::memory_order_release);
  uint64_t unclaimed = generation_ << 2 | kUnclaimed;
  if (h.claim_.compare_exchange_strong(unclaimed, generation_ << 2 | kCaller,
                                       std::memory_order_acq_rel)) {
    return;  // the helper had not started: it skips the job and never reads the tokens
  }
  SpinUntil([&] { return h.finished_.load(std::memory_order_acquire) == generation_; });
  keys_ready_ = ok;
}

std::vector<uint64_t> KeyHelper::Lease::TakeKeys() {
  if (!keys_ready_ || !helper_->keys_complete_) return {};
  helper_->keys_complete_ = false;
  return std::move(helper_->keys_);
}

std::optional<std::vector<Indexer::TieredMatch>> KeyHelper::Lease::TakeWalk() {
  if (!keys_ready_) return std::nullopt;
  return std::exchange(helper_->walked_, std::nullopt);
}

KeyHelper::Lease::~Lease() {
  End(false);
  helper_->leased_.store(false, std::memory_order_release);
}

}  // namespace kvo
