#include "indexer/service/key_helper.h"

#include <algorithm>
#include <span>

#include "common/spin.h"
#include "indexer/indexer.h"

namespace kvo {

KeyHelper::KeyHelper(const Indexer* index, Clock* clock, Options options)
    : index_(index),
      clock_(clock),
      options_(std::move(options)),
      walk_thread_(index != nullptr && options_.walk_thread),
      thread_([this] { Run(); }) {
  if (walk_thread_) walker_ = std::thread([this] { WalkRun(); });
}

KeyHelper::~KeyHelper() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  walk_cv_.SignalAll();
  thread_.join();
  if (walker_.joinable()) walker_.join();
}

std::unique_ptr<KeyHelper::Lease> KeyHelper::TryLease() {
  bool expected = false;
  if (!leased_.compare_exchange_strong(expected, true, std::memory_order_acquire)) return nullptr;
  return std::make_unique<Lease>(this);
}

void KeyHelper::Run() {
  const bool walk_thread = walk_thread_;
  for (;;) {
    size_t block_size;
    size_t max_blocks;
    uint64_t parent;
    uint64_t generation;
    int64_t posted_ns;
    {
      MutexLock lock(&mu_);
      while (!posted_ && !stop_) cv_.Wait();
      if (stop_) return;
      posted_ = false;
      block_size = block_size_;
      max_blocks = max_tokens_ / block_size_;
      parent = root_;
      generation = generation_;
      posted_ns = posted_ns_;
    }
    uint64_t unclaimed = generation << 2 | kUnclaimed;
    if (!claim_.compare_exchange_strong(unclaimed, generation << 2 | kHelper,
                                        std::memory_order_acq_rel)) {
      continue;  // the lease took the job back (or a newer one is posted)
    }
    start_delay_ns_ = clock_->MonotonicNanos() - posted_ns;
    keys_.clear();
    keys_complete_ = false;
    walked_.reset();
    // The walk: on the walk thread, which reads keys_ up to hashed_ (so keys_ never moves: room
    // for every block the list can hold, reserved here), or on this thread, where it takes the
    // index's reader lock and gives it back below.
    std::unique_ptr<Indexer::TieredWalk> walk;
    if (walk_thread) {
      keys_.reserve(max_blocks);
      hashed_.store(0, std::memory_order_relaxed);
      hash_state_.store(kHashing, std::memory_order_relaxed);
      walk_over_.store(false, std::memory_order_relaxed);
      {
        MutexLock lock(&mu_);  // publishes the above and the keys' place to the walk thread
        walk_posted_ = generation;
        walk_keys_ = keys_.data();
      }
      walk_cv_.Signal();
    } else if (index_ != nullptr) {
      walk = index_->StartTieredWalk();
    }
    size_t blocks = 0;  // hashed
    size_t walked = 0;  // of those, walked on this thread
    bool abandon = false;
    for (;;) {
      // `end_` before `avail_`: once the list is complete, the count read after it is final.
      const int end = end_.load(std::memory_order_acquire);
      const size_t n = avail_.load(std::memory_order_acquire);
      const int64_t* data = data_.load(std::memory_order_acquire);
      if (end == kCancelled) break;
      if (walk_thread && walk_over_.load(std::memory_order_acquire)) break;
      if ((blocks + 1) * block_size <= n) {
        const size_t batch = std::min<size_t>(64, n / block_size - blocks);
        if (walk_thread && blocks + batch > max_blocks) {
          abandon = true;  // more tokens than Begin said: keys_ would move under the walk
          break;
        }
        // Hash what is there first (a few blocks at a time, so a cancel is seen soon): the chain
        // is the longest job and only this thread can do it.
        if (options_.before_batch) options_.before_batch();
        keys_.resize(blocks + batch);  // with the walk thread: inside the reservation, no move
        parent = ChainContentKeys(parent, data + blocks * block_size, block_size, batch,
                                  keys_.data() + blocks);
        blocks += batch;
        progress_.fetch_add(1, std::memory_order_relaxed);
        if (walk_thread) hashed_.store(blocks, std::memory_order_release);
        continue;
      }
      if (walk != nullptr && walked < blocks) {
        // Waiting for tokens (or at the end): walk the keys hashed so far.
        const size_t step = std::min<size_t>(64, blocks - walked);
        if (!walk->Walk(std::span<const uint64_t>(keys_.data() + walked, step))) {
          break;  // the walk is over: no later key changes the answer
        }
        walked += step;
        progress_.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      if (end == kComplete) {
        keys_complete_ = true;
        break;
      }
      SpinUntil([&] {
        return end_.load(std::memory_order_acquire) != kOpen ||
               avail_.load(std::memory_order_acquire) >= (blocks + 1) * block_size ||
               (walk_thread && walk_over_.load(std::memory_order_acquire));
      });
    }
    // A cancelled job's walk is dropped (its destructor gives the lock back).
    abandon = abandon || end_.load(std::memory_order_acquire) == kCancelled;
    if (walk_thread) {
      hash_state_.store(abandon ? kAbandoned : kHashed, std::memory_order_release);
      SpinUntil([&] { return walk_done_.load(std::memory_order_acquire) == generation; });
      if (abandon) keys_complete_ = false;
    } else if (walk != nullptr) {
      if (!abandon) walked_ = walk->Finish();
      walk.reset();
    }
    jobs_done_.fetch_add(1, std::memory_order_relaxed);
    finished_.store(generation, std::memory_order_release);
  }
}

void KeyHelper::WalkRun() {
  uint64_t started = 0;
  for (;;) {
    uint64_t generation;
    const uint64_t* keys;
    {
      MutexLock lock(&mu_);
      while (walk_posted_ == started && !stop_) walk_cv_.Wait();
      if (stop_) return;
      generation = started = walk_posted_;
      keys = walk_keys_;
    }
    // The index's reader lock, taken and given back on this thread.
    std::unique_ptr<Indexer::TieredWalk> walk = index_->StartTieredWalk();
    size_t walked = 0;
    bool abandoned = false;
    for (;;) {
      // The state before the count: once hashing is over, the count read after it is final.
      const int state = hash_state_.load(std::memory_order_acquire);
      const size_t n = hashed_.load(std::memory_order_acquire);
      if (state == kAbandoned) {
        abandoned = true;
        break;
      }
      if (walked < n) {
        const size_t step = std::min<size_t>(64, n - walked);
        if (!walk->Walk(std::span<const uint64_t>(keys + walked, step))) {
          walk_over_.store(true, std::memory_order_release);  // the hashing may stop
          break;
        }
        walked += step;
        progress_.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      if (state == kHashed) break;
      SpinUntil([&] {
        return hash_state_.load(std::memory_order_acquire) != kHashing ||
               hashed_.load(std::memory_order_acquire) > walked;
      });
    }
    if (!abandoned) walked_ = walk->Finish();
    walk.reset();
    walk_done_.store(generation, std::memory_order_release);
  }
}

void KeyHelper::Lease::Begin(int64_t block_size, std::string_view lora_name, size_t max_tokens) {
  KeyHelper& h = *helper_;
  block_size_ = static_cast<size_t>(block_size);
  root_ = ContentKeyRoot(lora_name);
  h.data_.store(nullptr, std::memory_order_relaxed);
  h.avail_.store(0, std::memory_order_relaxed);
  h.end_.store(kOpen, std::memory_order_relaxed);
  {
    MutexLock lock(&h.mu_);  // publishes the above and the job to the helper
    h.block_size_ = block_size_;
    h.max_tokens_ = max_tokens;
    h.root_ = root_;
    generation_ = ++h.generation_;
    h.posted_ns_ = h.clock_->MonotonicNanos();
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
  // Waits while the helper's threads make progress; End(true) gives up after
  // give_up_after_ns without any (the tokens stay in place: the destructor waits instead).
  const int64_t wait_from = h.clock_->MonotonicNanos();
  uint64_t seen = h.progress_.load(std::memory_order_relaxed);
  int64_t quiet_since = wait_from;
  SpinUntil([&] {
    if (h.finished_.load(std::memory_order_acquire) == generation_) return true;
    if (!ok) return false;
    const int64_t now = h.clock_->MonotonicNanos();
    const uint64_t progress = h.progress_.load(std::memory_order_relaxed);
    if (progress != seen) {
      seen = progress;
      quiet_since = now;
      return false;
    }
    gave_up_ = now - quiet_since >= h.options_.give_up_after_ns;
    return gave_up_;
  });
  end_wait_ns_ = h.clock_->MonotonicNanos() - wait_from;
  if (gave_up_) {
    h.end_.store(kCancelled, std::memory_order_release);  // the helper drops it when it runs
    HashTheRest();
    return;
  }
  start_delay_ns_ = h.start_delay_ns_;
  keys_ready_ = ok;
}

void KeyHelper::Lease::HashTheRest() {
  KeyHelper& h = *helper_;
  const int64_t* const data = h.data_.load(std::memory_order_relaxed);  // this thread's stores
  const size_t blocks = h.avail_.load(std::memory_order_relaxed) / block_size_;
  // With the walk thread, the keys the helper published for this job are final (hashed_,
  // released after writing them; keys_ reserved, so the helper writes only past them).
  size_t have = 0;
  if (h.walk_thread_) {
    const uint64_t* published = nullptr;
    {
      MutexLock lock(&h.mu_);  // the job's place, posted after its hashed_ was reset
      if (h.walk_posted_ == generation_) published = h.walk_keys_;
    }
    if (published != nullptr) {
      have = std::min(h.hashed_.load(std::memory_order_acquire), blocks);
      own_keys_.assign(published, published + have);
    }
  }
  own_keys_.resize(blocks);
  if (blocks > have) {
    ChainContentKeys(have > 0 ? own_keys_[have - 1] : root_, data + have * block_size_, block_size_,
                     blocks - have, own_keys_.data() + have);
  }
}

std::vector<uint64_t> KeyHelper::Lease::TakeKeys() {
  if (gave_up_) return std::move(own_keys_);
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
  if (gave_up_) {
    // The helper may still read the tokens and own keys_: the next lease waits for it to leave.
    SpinUntil([this] { return helper_->finished_.load(std::memory_order_acquire) == generation_; });
  }
  helper_->leased_.store(false, std::memory_order_release);
}

}  // namespace kvo
