#include "manager/fs_transport.h"

#include "common/logging.h"

namespace kvo {
namespace {

// The digest a file-tier key names (its hex validated on decode), within OffloadKey's bound.
Result<BlockDigest> DigestOf(const FsBlockKey& key) {
  KVO_ASSIGN_OR_RETURN(BlockDigest digest, BlockDigest::FromHex(key.hex));
  if (digest.size() > OffloadKey::kMaxHashBytes) {
    return Status::InvalidArgument("block hash " + key.hex + " longer than " +
                                   std::to_string(OffloadKey::kMaxHashBytes) + " bytes");
  }
  return digest;
}

// The file tier's key for an OffloadKey: the digest's hex and the group.
Result<FsBlockKey> FsKeyOf(const OffloadKey& k) {
  return FsBlockKeyFromDigest(k.Digest().bytes(), k.group());
}

}  // namespace

Result<std::shared_ptr<FsTransport>> FsTransport::Create(FsBlockStoreOptions options,
                                                         HostRegion rows) {
  KVO_ASSIGN_OR_RETURN(std::unique_ptr<FsBlockStore> tier,
                       FsBlockStore::Open(std::move(options), rows));
  return std::shared_ptr<FsTransport>(new FsTransport(std::move(tier)));
}

Status FsTransport::Submit(const TierJob& job, bool store) {
  std::vector<FsBlockKey> keys;
  std::vector<int64_t> slots(job.slots.begin(), job.slots.end());
  for (const OffloadKey& k : job.keys) {
    KVO_ASSIGN_OR_RETURN(FsBlockKey fk, FsKeyOf(k));
    keys.push_back(std::move(fk));
  }
  // Hold the lock across submission so a fast job cannot finish before it is registered.
  MutexLock lock(&mu_);
  Result<JobId> id = store ? tier_->SubmitStore(std::move(keys), std::move(slots))
                           : tier_->SubmitLoad(std::move(keys), std::move(slots));
  if (!id.ok()) return id.status();
  pending_[*id] = Pending{job.job_id, store, job.keys};
  return Status::Ok();
}

Status FsTransport::SubmitStore(const TierJob& job) { return Submit(job, true); }
Status FsTransport::SubmitLoad(const TierJob& job) { return Submit(job, false); }

void FsTransport::TakeFinished(std::vector<JobResult>* out) {
  std::vector<FsJobResult> done;
  MutexLock lock(&mu_);
  tier_->TakeFinished(&done);
  for (FsJobResult& r : done) {
    auto it = pending_.find(r.job_id);
    if (it == pending_.end()) continue;
    const Pending& p = it->second;
    JobResult jr;
    jr.job_id = p.job_id;
    jr.success = r.success;
    if (!r.success) {
      std::vector<OffloadKey> ok;
      for (size_t i = 0; i < r.blocks.size(); ++i) {
        const FsBlockResult& b = r.blocks[i];
        if (b.outcome == FsBlockOutcome::kOk || b.outcome == FsBlockOutcome::kSkipped) {
          ok.push_back(p.keys[i]);
        } else if (!p.store &&
                   (b.outcome == FsBlockOutcome::kMiss || b.outcome == FsBlockOutcome::kCorrupt)) {
          jr.lost_keys.push_back(p.keys[i]);
        } else {
          KVO_LOG_WARN("fs transport: {} {}: {}", p.store ? "store" : "load", p.keys[i].Hex(),
                       b.status.ToString());
        }
      }
      if (!ok.empty()) jr.successful_keys = std::move(ok);
    }
    out->push_back(std::move(jr));
    pending_.erase(it);
  }
}

void FsTransport::Drain() { tier_->Drain(); }

Status FsTransport::Delete(std::span<const OffloadKey> keys) {
  Status first;
  for (const OffloadKey& k : keys) {
    auto fk = FsKeyOf(k);
    Status s = fk.ok() ? tier_->Delete(*fk) : fk.status();
    if (!s.ok() && first.ok()) first = s;
  }
  return first;
}

Status FsTransport::List(std::vector<OffloadKey>* out) {
  // Only temp files older than kFsStaleTempSeconds go: root_dir is shared, and a fresh one may be
  // another engine's write in flight.
  KVO_ASSIGN_OR_RETURN(FsScanResult scan, tier_->Scan(kFsStaleTempSeconds));
  for (const std::string& p : scan.problems) KVO_LOG_WARN("fs tier scan: {}", p);
  for (const FsBlockKey& k : scan.blocks) {
    auto digest = DigestOf(k);
    if (!digest.ok()) {
      KVO_LOG_WARN("fs tier scan: {}", digest.status().message());
      continue;
    }
    out->push_back(OffloadKey::FromDigest(*digest, k.group));
  }
  return Status::Ok();
}

}  // namespace kvo
