// A /query's content keys hashed on a thread of their own while the handler's thread reads the
// token list (ParseRouterQuery's TokenSink), so the two overlap: on a 128k-token prompt the keys
// (8,192 chained XXH3-64, ChainContentKeys) cost somewhat less than the parse.
//
// One query at a time holds the helper (TryLease); a query that finds it held hashes on its own
// thread as without it. The helper thread waits on a condition variable for a lease's Begin, then
// follows the parse through two atomics (tokens read so far, and whether the list is complete),
// spinning between the parser's reports (about one per thousand tokens). Whoever claims the job
// first does it: the helper when it wakes in time; otherwise the lease's End claims it and the
// query gets no keys (the walk then hashes lazily, as without a helper), so a slow wake-up never
// makes a query wait. Each job has a generation, part of every claim, so a helper that wakes late
// for an old job can never claim a newer one with the old job's block size and LoRA.
// Ownership: the token buffer is the parser's; End(false) does not return while the helper reads
// it (so the parser may free it after End); the keys are the helper's until it reports the job
// done.
//
// A helper that stalls (descheduled by the hypervisor or the kernel) does not hold the query up:
// End(true) waits for the helper only while it makes progress (a batch of keys hashed or walked,
// about a microsecond each); after `give_up_after_ns` without any, the lease gives the job up
// (the helper drops it when it runs again) and hashes the keys the helper had not published on
// the calling thread (with the walk thread the published ones are final; without it, all), so
// the query gets its keys but no walk: the handler walks them itself. The tokens End(true) was
// given are then read by the helper until the lease is destroyed, so they must stay in place until
// then (ParseRouterQuery hands them over in RouterQuery::token_ids; moving that vector keeps them
// in place).
//
// Given the index, the helper also walks the keys it hashed (Indexer::TieredWalk, every source:
// /query's walk) whenever it waits for the parser, and the rest once the list is complete, so
// the handler only renders; a walk that ends early (no instance still matching) ends the hashing
// too. Hashing comes first: on a core as fast as the parser's the chain alone keeps up, and the
// walk waits for the end (as it would on the handler's thread). The walk holds the index's reader
// lock while the parse lasts.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string_view>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/mutex.h"
#include "indexer/indexer.h"
#include "indexer/service/router_api.h"

namespace kvo {

class KeyHelper {
 public:
  class Lease;

  struct Options {
    // With an index: the walk on a third thread of its own, following the hashing (for machines
    // with cores to spare).
    bool walk_thread = false;
    // End(true) gives the job up after this long without progress from the helper's threads
    // (the default: never; the service's is ServiceOptions::key_helper_patience_ns).
    int64_t give_up_after_ns = std::numeric_limits<int64_t>::max();
    // Tests: run on the helper's thread before each batch it hashes (to stall it there).
    std::function<void()> before_batch;
  };

  // index: walk each query's keys too (nullptr: keys only). clock: the times a lease reports
  // (start_delay_ns, end_wait_ns) and End's patience. Both outlive the helper.
  KeyHelper(const Indexer* index, Clock* clock, Options options);
  explicit KeyHelper(const Indexer* index = nullptr, Clock* clock = SystemClock())
      : KeyHelper(index, clock, Options()) {}
  ~KeyHelper();  // stops and joins the threads (no lease may be held)
  KeyHelper(const KeyHelper&) = delete;
  KeyHelper& operator=(const KeyHelper&) = delete;

  // The helper for one query's parse, or nullptr while another query holds it.
  std::unique_ptr<Lease> TryLease();

  // How many jobs the helper thread did (for tests).
  uint64_t jobs_done() const { return jobs_done_.load(std::memory_order_relaxed); }

 private:
  enum : int { kOpen = 0, kComplete = 1, kCancelled = 2 };
  // The hashing, as the walk thread sees it.
  enum : int { kHashing = 0, kHashed = 1, kAbandoned = 2 };
  // A claim: (job generation << 2) | one of these.
  enum : uint64_t { kUnclaimed = 0, kHelper = 1, kCaller = 2 };
  void Run();
  void WalkRun();

  Mutex mu_;
  CondVar cv_{&mu_};
  bool posted_ GUARDED_BY(mu_) = false;
  bool stop_ GUARDED_BY(mu_) = false;
  // The job: written by the lease under mu_, read by the helper under mu_.
  size_t block_size_ GUARDED_BY(mu_) = 0;
  size_t max_tokens_ GUARDED_BY(mu_) = 0;
  uint64_t root_ GUARDED_BY(mu_) = 0;
  uint64_t generation_ GUARDED_BY(mu_) = 0;
  int64_t posted_ns_ GUARDED_BY(mu_) = 0;  // when the job was posted (Begin)
  int64_t start_delay_ns_ = 0;             // the helper's until finished_: posted to claimed
  // Progress, written by the parsing thread (release), read by the helper (acquire).
  std::atomic<const int64_t*> data_{nullptr};
  std::atomic<size_t> avail_{0};
  std::atomic<int> end_{kOpen};
  std::atomic<uint64_t> claim_{kUnclaimed};
  std::atomic<uint64_t> finished_{0};  // the generation the helper is done with (keys_ readable)
  std::vector<uint64_t> keys_;         // the helper's until finished_
  bool keys_complete_ = false;         // the helper's until finished_: every block hashed
  std::optional<std::vector<Indexer::TieredMatch>> walked_;  // the helper's until finished_
  // Bumped by the helper after each batch it hashes or walks, and by the walk thread after each
  // step: End(true) waits while it moves.
  std::atomic<uint64_t> progress_{0};
  const Indexer* const index_;
  Clock* const clock_;
  const Options options_;
  const bool walk_thread_;  // the walk on walker_ (declared before the threads that read it)
  // The walk thread's job (posted by the helper under mu_ after its claim): the generation, and
  // keys_'s storage (reserved for the most blocks the list can hold, so it never moves).
  CondVar walk_cv_{&mu_};
  uint64_t walk_posted_ GUARDED_BY(mu_) = 0;
  const uint64_t* walk_keys_ GUARDED_BY(mu_) = nullptr;
  // Helper -> walk thread: keys hashed so far (release after writing them), then the end.
  std::atomic<size_t> hashed_{0};
  std::atomic<int> hash_state_{kHashing};
  // Walk thread -> helper: the walk is over (hash no more), and done with a generation.
  std::atomic<bool> walk_over_{false};
  std::atomic<uint64_t> walk_done_{0};
  std::atomic<bool> leased_{false};
  std::atomic<uint64_t> jobs_done_{0};
  std::thread thread_;
  std::thread walker_;  // the walk thread, when asked for (joinable: it runs)
};

class KeyHelper::Lease : public TokenSink {
 public:
  explicit Lease(KeyHelper* helper) : helper_(helper) {}
  ~Lease() override;  // waits for the helper to leave the job (one given up too), then frees it
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;

  void Begin(int64_t block_size, std::string_view lora_name, size_t max_tokens) override;
  void Tokens(const int64_t* data, size_t n) override;
  // Waits until the helper is done with the tokens, or claims the job first (then the helper
  // skips it); End(true) gives the job up instead when the helper stalls (gave_up()).
  void End(bool ok) override;
  // End(true) gave the job up: the keys finished on the calling thread, no walk; the destructor
  // waits for the helper.
  bool gave_up() const { return gave_up_; }

  // After End(true): the content keys of every complete block, when the helper hashed them (or
  // the lease finished them after giving the job up); else empty (it had not started in time, or
  // the list was not read).
  std::vector<uint64_t> TakeKeys();
  // After End(true), with an index: the tiered walk of those keys over every source (as
  // Indexer::Tiered would answer), when the helper walked them; else nullopt.
  std::optional<std::vector<Indexer::TieredMatch>> TakeWalk();
  // After End, when the helper did the job: how long it took to claim it after Begin (its wake-up),
  // and how long End waited for it after the list was complete (the chain's tail); else -1.
  int64_t start_delay_ns() const { return start_delay_ns_; }
  int64_t end_wait_ns() const { return end_wait_ns_; }

 private:
  // End(true) after giving the job up: the keys the helper published, then the rest.
  void HashTheRest();

  KeyHelper* const helper_;
  uint64_t generation_ = 0;  // 0: not begun
  size_t block_size_ = 0;    // the job's (Begin)
  uint64_t root_ = 0;
  std::vector<uint64_t> own_keys_;  // HashTheRest's
  bool ended_ = false;
  bool keys_ready_ = false;
  bool gave_up_ = false;
  int64_t start_delay_ns_ = -1;
  int64_t end_wait_ns_ = -1;
};

}  // namespace kvo
