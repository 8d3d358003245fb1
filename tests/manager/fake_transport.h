// FakeTransport: a TierTransport for tests whose jobs finish only when told (the job contract's
// fake, tests/testing/fake_jobs.h), over an in-memory "medium" (a set of keys).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "manager/indexed_tier.h"
#include "tests/testing/fake_jobs.h"

namespace kvo {

// Completes jobs when told; the medium is a set of keys.
class FakeTransport final : public TierTransport, public testing::FakeJobs<TierJob, JobResult> {
 public:
  // A crash: jobs in flight are lost (finished-but-unreported ones are on the medium).
  void Crash() { Lose(); }

  Status SubmitStore(const TierJob& job) override {
    Submit(job);
    return Status::Ok();
  }
  Status SubmitLoad(const TierJob& job) override {
    Submit(job);
    return Status::Ok();
  }
  void TakeFinished(std::vector<JobResult>* out) override { FakeJobs::TakeFinished(out); }
  void Drain() override {
    while (!submitted.empty()) Finish(submitted.front().job_id, true);
  }
  Status Delete(std::span<const OffloadKey> keys) override {
    if (fail_deletes) return Status::IOError("injected: delete failed");
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
    const TierJob* job = Find(job_id);
    ASSERT_NE(job, nullptr);
    if (!job->is_promotion) {
      for (const OffloadKey& k : job->keys) {
        const bool ok = success || (ok_keys && std::find(ok_keys->begin(), ok_keys->end(), k) !=
                                                   ok_keys->end());
        if (ok) medium.insert(k.VllmBytes());
      }
    }
    for (const OffloadKey& k : lost) medium.erase(k.VllmBytes());
    Complete(job_id, JobResult{job_id, success, std::move(ok_keys), std::move(lost)});
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

  std::set<std::string> medium;  // OffloadKey::VllmBytes() of what is stored
  bool fail_deletes = false;     // Delete fails and removes nothing
  std::vector<OffloadKey> deleted;
};

}  // namespace kvo
