// FakeTransport: a TierTransport for tests whose jobs finish only when told, over an in-memory
// "medium" (a set of keys).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "manager/indexed_tier.h"

namespace kvo {

// Completes jobs when told; the medium is a set of keys.
class FakeTransport final : public TierTransport {
 public:
  // A crash: jobs in flight are lost (finished-but-unreported ones are on the medium).
  void Crash() {
    submitted.clear();
    done.clear();
  }

  Status SubmitStore(const TransferJob& job) override {
    submitted.push_back(job);
    return Status::Ok();
  }
  Status SubmitLoad(const TransferJob& job) override {
    submitted.push_back(job);
    return Status::Ok();
  }
  void TakeFinished(std::vector<JobResult>* out) override {
    for (JobResult& r : done) out->push_back(std::move(r));
    done.clear();
  }
  void Drain() override {
    while (!submitted.empty()) Finish(submitted.front().job_id, true);
  }
  Status Delete(std::span<const OffloadKey> keys) override {
    for (const OffloadKey& k : keys) {
      medium.erase(k.VllmBytes());
      deleted.push_back(k);
    }
    return Status::Ok();
  }
  Status List(std::vector<OffloadKey>* out) override {
    for (const std::string& b : medium) out->push_back(FromBytes(b));
    return Status::Ok();
  }
  // Finishes a submitted job; `ok_keys` for a partial success, `lost` for corrupt blocks.
  void Finish(uint64_t job_id, bool success, std::optional<std::vector<OffloadKey>> ok_keys = {},
              std::vector<OffloadKey> lost = {}) {
    auto it = std::find_if(submitted.begin(), submitted.end(),
                           [&](const TransferJob& j) { return j.job_id == job_id; });
    ASSERT_NE(it, submitted.end());
    if (!it->is_promotion) {
      for (const OffloadKey& k : it->keys) {
        const bool ok = success || (ok_keys && std::find(ok_keys->begin(), ok_keys->end(), k) !=
                                                   ok_keys->end());
        if (ok) medium.insert(k.VllmBytes());
      }
    }
    for (const OffloadKey& k : lost) medium.erase(k.VllmBytes());
    done.push_back(JobResult{job_id, success, std::move(ok_keys), std::move(lost)});
    submitted.erase(it);
  }
  void FinishAll() {
    while (!submitted.empty()) Finish(submitted.front().job_id, true);
  }

  void Put(const OffloadKey& k) { medium.insert(k.VllmBytes()); }
  static OffloadKey FromBytes(const std::string& b) {
    uint32_t group = 0;
    for (size_t i = b.size() - 4; i < b.size(); ++i) group = (group << 8) | uint8_t(b[i]);
    return OffloadKey::FromDigest(std::string_view(b).substr(0, b.size() - 4), group);
  }

  std::vector<TransferJob> submitted;
  std::vector<JobResult> done;
  std::set<std::string> medium;  // OffloadKey::VllmBytes() of what is stored
  std::vector<OffloadKey> deleted;
};

}  // namespace kvo
