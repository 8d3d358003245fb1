// IndexedTier with async_lookup: vLLM's RETRY-then-verdict secondary lookup (B.11), through the
// manager: RETRY until the step ends, then the verdict (a HIT starts a promotion), and the
// tiering async-delay histogram measured from the first RETRY to the verdict.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "common/metrics.h"
#include "manager/indexed_tier.h"
#include "manager/metrics.h"
#include "manager/offload_manager.h"
#include "tests/manager/fake_transport.h"
#include "tests/testing/manual_clock.h"

namespace kvo {
namespace {

OffloadKey K(int i) { return OffloadKey::FromDigest("blk" + std::to_string(i), 0); }

class IndexedTierAsyncTest : public ::testing::Test {
 protected:
  void Build(bool async_lookup) {
    transport_->Put(K(1));  // on the medium before start: indexed by Create
    IndexedTierOptions to;
    to.name = "fs";
    to.async_lookup = async_lookup;
    auto tier = IndexedTier::Create(to, transport_);
    ASSERT_TRUE(tier.ok()) << tier.status().ToString();
    tier_ = std::shared_ptr<IndexedTier>(std::move(tier).value());
    ManagerOptions o;
    o.num_blocks = 4;
    o.clock = &clock_;
    o.secondary_tiers.push_back(tier_);
    auto m = OffloadManager::Create(std::move(o));
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    m_ = std::move(m).value();
    ctx_.req_id = "r";
  }

  testing::ManualClock clock_;
  std::shared_ptr<FakeTransport> transport_ = std::make_shared<FakeTransport>();
  std::shared_ptr<IndexedTier> tier_;
  std::unique_ptr<OffloadManager> m_;
  RequestContext ctx_;
};

TEST_F(IndexedTierAsyncTest, SynchronousByDefault) {
  Build(false);
  EXPECT_EQ(m_->Lookup(K(1), ctx_), LookupResult::kHitPending);
  EXPECT_EQ(m_->Lookup(K(2), ctx_), LookupResult::kMiss);
}

TEST_F(IndexedTierAsyncTest, RetryUntilTheStepEndsThenTheVerdict) {
  Build(true);
  EXPECT_EQ(m_->Lookup(K(1), ctx_), LookupResult::kRetry);
  EXPECT_EQ(m_->Lookup(K(2), ctx_), LookupResult::kRetry);
  clock_.AdvanceMicros(3000);
  EXPECT_EQ(m_->Lookup(K(1), ctx_), LookupResult::kRetry);  // same step: still checking
  m_->OnScheduleEnd();
  clock_.AdvanceMicros(7000);
  // Verdicts: K1 is held (a promotion starts), K2 is not.
  EXPECT_EQ(m_->Lookup(K(1), ctx_), LookupResult::kHitPending);
  EXPECT_EQ(m_->Lookup(K(2), ctx_), LookupResult::kMiss);
  // The verdict stays cached for the request (vLLM's AsyncLookupManager): no new check.
  EXPECT_EQ(m_->Lookup(K(2), ctx_), LookupResult::kMiss);
  // The CPU tier now answers for K1 (its promotion is pending), without asking the tier.
  EXPECT_EQ(m_->Lookup(K(1), ctx_), LookupResult::kHitPending);

  MetricsRegistry registry;
  OffloadMetricsOptions mo;
  mo.tiering = true;
  auto exporter = OffloadMetricsExporter::Create(&registry, mo);
  ASSERT_TRUE(exporter.ok());
  ASSERT_TRUE((*exporter)->Export(m_->GetStats()).ok());
  const std::string text = registry.RenderPrometheus();
  // K1 and K2 each waited 10 ms from their first RETRY to their verdict (le 0.01 holds both).
  EXPECT_NE(text.find("vllm:kv_offload_tiering_lookup_async_delay_seconds_bucket{tier=\"1:fs\","
                      "le=\"0.005\"} 0.0\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("vllm:kv_offload_tiering_lookup_async_delay_seconds_bucket{tier=\"1:fs\","
                      "le=\"0.01\"} 2.0\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("vllm:kv_offload_tiering_chunk_hits_total{tier=\"1:fs\"} 1.0\n"),
            std::string::npos)
      << text;
}

TEST_F(IndexedTierAsyncTest, VerdictsStayCachedUntilTheirLastRequestFinishes) {
  Build(true);
  RequestContext other;
  other.req_id = "r2";
  EXPECT_EQ(m_->Lookup(K(2), ctx_), LookupResult::kRetry);
  m_->OnScheduleEnd();
  m_->OnScheduleEnd();  // unclaimed for a step: still cached
  EXPECT_EQ(m_->Lookup(K(2), ctx_), LookupResult::kMiss);
  EXPECT_EQ(m_->Lookup(K(2), other), LookupResult::kMiss);  // a second request shares it
  m_->OnRequestFinished(ctx_);
  EXPECT_EQ(m_->Lookup(K(2), other), LookupResult::kMiss);  // r2 still holds it
  m_->OnRequestFinished(other);
  EXPECT_EQ(m_->Lookup(K(2), other), LookupResult::kRetry);  // dropped with its last request
  m_->OnScheduleEnd();
  EXPECT_EQ(m_->Lookup(K(2), other), LookupResult::kMiss);
}

TEST_F(IndexedTierAsyncTest, VerdictsOfNoRequestAreGivenOnceOrDroppedAfterAStep) {
  Build(true);
  RequestContext none;  // no req_id: nothing would finish it, so nothing may hold the verdict
  EXPECT_EQ(m_->Lookup(K(2), none), LookupResult::kRetry);
  m_->OnScheduleEnd();
  EXPECT_EQ(m_->Lookup(K(2), none), LookupResult::kMiss);   // given once ...
  EXPECT_EQ(m_->Lookup(K(2), none), LookupResult::kRetry);  // ... then a new check
  m_->OnScheduleEnd();                                      // decided
  m_->OnScheduleEnd();                                      // unclaimed for a step: dropped
  EXPECT_EQ(m_->Lookup(K(2), none), LookupResult::kRetry);
}

}  // namespace
}  // namespace kvo
