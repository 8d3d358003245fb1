// FsTransport: the TierTransport (manager/indexed_tier.h) over kvo's file tier (transfer/fs_tier.h)
// and the CPU tier's host rows, so an IndexedTier runs on a real disk with vLLM's layout. Keys
// map to files by their raw digest (hex) and group; List() is the tier's startup scan (stale temp
// files and wrong-size files removed), so OffloadManager::Recover reconciles against the disk.
// Loads that find a block missing or corrupt report it in JobResult::lost_keys (the file tier
// has already removed a corrupt file).
//
// Thread-safe: the file tier completes jobs on its own threads; the job map has its own mutex.
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
  static Result<std::shared_ptr<FsTransport>> Create(FsTierOptions options, HostRegion rows);

  Status SubmitStore(const TransferJob& job) override;
  Status SubmitLoad(const TransferJob& job) override;
  void TakeFinished(std::vector<JobResult>* out) override;
  void Drain() override;
  Status Delete(std::span<const OffloadKey> keys) override;
  Status List(std::vector<OffloadKey>* out) override;

  FsTier& tier() { return *tier_; }

 private:
  explicit FsTransport(std::unique_ptr<FsTier> tier) : tier_(std::move(tier)) {}
  Status Submit(const TransferJob& job, bool store);

  std::unique_ptr<FsTier> tier_;
  Mutex mu_;
  struct Pending {
    uint64_t job_id = 0;  // the manager's
    bool store = false;
    std::vector<OffloadKey> keys;
  };
  std::unordered_map<uint64_t, Pending> pending_ GUARDED_BY(mu_);  // by file-tier job id
};

}  // namespace kvo
