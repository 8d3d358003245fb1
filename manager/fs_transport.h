// FsTransport: the TierTransport (manager/indexed_tier.h) over the file block store
// (transfer/fs_block_store.h) and the CPU tier's host rows, so an IndexedTier runs on a real disk
// with vLLM's layout. A thin shim: it maps keys (an OffloadKey's raw digest as hex, and its group)
// and job ids (the manager's <-> the store's), and folds the store's per-block outcomes into
// vLLM's JobResult (successful_keys; loads that find a block missing or corrupt list it in
// lost_keys, the store having removed a corrupt file). List() is the store's startup scan (temp
// files older than kFsStaleTempSeconds — never fresh ones, root_dir is shared — and wrong-size
// files removed), so OffloadManager::Recover reconciles against the
// disk. Completion order is the store's (completion order, transfer/job.h).
//
// Thread-safe: the store completes jobs on its own threads; the job map has its own mutex.
#pragma once

#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "manager/indexed_tier.h"
#include "transfer/transfer.h"

namespace kvo {

class FsTransport final : public TierTransport {
 public:
  // Opens the file tier over `rows` (the CPU tier's host region; row_stride = block file size).
  static Result<std::shared_ptr<FsTransport>> Create(FsBlockStoreOptions options, HostRegion rows);

  Status SubmitStore(const TierJob& job) override;
  Status SubmitLoad(const TierJob& job) override;
  void TakeFinished(std::vector<JobResult>* out) override;
  void Drain() override;
  Status Delete(std::span<const OffloadKey> keys) override;
  Status List(std::vector<OffloadKey>* out) override;

  FsBlockStore& store() { return *tier_; }

 private:
  explicit FsTransport(std::unique_ptr<FsBlockStore> tier) : tier_(std::move(tier)) {}
  Status Submit(const TierJob& job, bool store);

  std::unique_ptr<FsBlockStore> tier_;  // the block store
  Mutex mu_;
  struct Pending {
    JobId job_id = 0;  // the manager's
    bool store = false;
    std::vector<OffloadKey> keys;
  };
  std::unordered_map<JobId, Pending> pending_ GUARDED_BY(mu_);  // by block-store job id
};

}  // namespace kvo
