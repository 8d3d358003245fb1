// Tiering (vllm-compat.md B.11) against vLLM's tests/v1/kv_offload/tiering/test_tiering_offloading
// .py (our own code and names): cascade to all tiers with pins, promotion (HIT_PENDING, then HIT
// two steps later), partial promotion failure, per-request batching of loads, no duplicate
// promotion, finalisation order, REQUEST_LEVEL cascading, reset draining the tiers, the tier
// filter; plus promotion allocation failures, RETRY, and the bounded IndexedTier (evictions and
// failed loads published as STORAGE removals).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "manager/indexed_tier.h"
#include "manager/lru_policy.h"
#include "manager/offload_manager.h"
#include "manager/secondary_tier.h"
#include "manager/testing/offload_manager_peer.h"
#include "tests/manager/fake_transport.h"

namespace kvo {
namespace {

OffloadKey K(int i) { return OffloadKey::FromDigest(std::to_string(i), 0); }
std::vector<OffloadKey> Range(int from, int to) {
  std::vector<OffloadKey> out;
  for (int i = from; i < to; ++i) out.push_back(K(i));
  return out;
}
RequestContext Ctx(const std::string& id) {
  RequestContext c;
  c.req_id = id;
  return c;
}
const RequestContext kCtx = Ctx("test");

// vLLM's ExampleSecondaryTierManager made controllable: stores land in `blocks` when submitted;
// jobs finish at once (sync) or when Finish() is called; every call is logged.
class FakeTier final : public SecondaryTier, public testing::FakeJobs<TierJob, JobResult> {
 public:
  FakeTier(std::string name, std::vector<std::string>* log, Medium medium = Medium::kStorage)
      : name_(std::move(name)), medium_(medium), log_(log) {}

  const std::string& name() const override { return name_; }
  Medium medium() const override { return medium_; }
  const std::optional<std::string>& locality() const override { return locality_; }
  LookupResult Lookup(const OffloadKey& key, const RequestContext& /*ctx*/) override {
    ++lookups;
    if (forced_lookup.has_value()) return *forced_lookup;
    return blocks.count(std::string(key.digest())) != 0 ? LookupResult::kHit : LookupResult::kMiss;
  }
  Status SubmitStore(const TierJob& job) override {
    Log("submit_store_" + name_, job.req_id);
    stores.push_back(job);
    for (const OffloadKey& k : job.keys) blocks.insert(std::string(k.digest()));
    if (sync) Post(JobResult{job.job_id, true, std::nullopt, {}});
    return Status::Ok();
  }
  Status SubmitLoad(const TierJob& job) override {
    Log("submit_load_" + name_, job.req_id);
    loads.push_back(job);
    if (load_result) {
      Post(load_result(job));
    } else if (sync) {
      Post(JobResult{job.job_id, true, std::nullopt, {}});
    }
    return Status::Ok();
  }
  void TakeFinished(std::vector<JobResult>* out) override { FakeJobs::TakeFinished(out); }
  void Drain() override { ++drains; }
  void TakeEvents(std::vector<OffloadingEvent>* out) override {
    for (OffloadingEvent& e : events) out->push_back(std::move(e));
    events.clear();
  }
  void ListHeld(std::vector<OffloadKey>* out) const override {
    for (const std::string& d : blocks) out->push_back(OffloadKey::FromDigest(d, 0));
  }
  void Touch(std::span<const OffloadKey> keys, const RequestContext& /*ctx*/) override {
    touched.emplace_back(keys.begin(), keys.end());
  }
  OffloadPolicy OnNewRequest(const RequestContext& /*ctx*/) override { return policy; }
  void OnRequestFinished(const RequestContext& ctx) override {
    Log("secondary_finish_" + name_, ctx.req_id);
  }

  void Log(const std::string& what, const std::string& req) {
    if (log_ != nullptr) log_->push_back(what + ":" + req);
  }

  std::string name_;
  Medium medium_;
  std::optional<std::string> locality_;
  std::vector<std::string>* log_;
  std::set<std::string> blocks;
  bool sync = true;
  std::function<JobResult(const TierJob&)> load_result;
  std::optional<LookupResult> forced_lookup;
  OffloadPolicy policy = OffloadPolicy::kBlockLevel;
  std::vector<TierJob> stores, loads;
  std::vector<OffloadingEvent> events;
  std::vector<std::vector<OffloadKey>> touched;
  int drains = 0;
  int lookups = 0;
};

class TieringTest : public ::testing::Test {
 protected:
  void SetUp() override { Build(5); }

  void Build(size_t num_blocks, size_t num_tiers = 2) {
    tiers_.clear();
    ManagerOptions o;
    o.num_blocks = num_blocks;
    o.track_blocks = true;
    for (size_t i = 0; i < num_tiers; ++i) {
      auto t = std::make_shared<FakeTier>(std::to_string(i + 1), &log_);
      tiers_.push_back(t);
      o.secondary_tiers.push_back(t);
    }
    auto m = OffloadManager::Create(std::move(o));
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    m_ = std::move(m).value();
  }

  FakeTier& T(size_t i) { return *tiers_[i]; }

  void Store(const std::vector<OffloadKey>& keys, const RequestContext& ctx = kCtx) {
    auto out = m_->PrepareStore(keys, ctx);
    ASSERT_TRUE(out.ok() && out->has_value());
    ASSERT_TRUE(m_->CompleteStore(keys, ctx, true).ok());
  }
  // vLLM's _simulate_on_schedule_end: end the step, drain events.
  void EndStep() {
    m_->OnScheduleEnd();
    m_->TakeEvents();
  }
  int32_t Ref(const OffloadKey& key) {
    const BlockStatus* b = OffloadManagerPeer::CpuPolicy(*m_).Get(key);
    return b == nullptr ? -100 : b->ref_cnt;
  }
  // vLLM's count_hits: leading HITs; -1 when a lookup is pending.
  int CountHits(const std::vector<OffloadKey>& keys, const RequestContext& ctx = kCtx) {
    int n = 0;
    for (const OffloadKey& k : keys) {
      const LookupResult r = m_->Lookup(k, ctx);
      if (r == LookupResult::kHitPending || r == LookupResult::kRetry) return -1;
      if (r != LookupResult::kHit) break;
      ++n;
    }
    return n;
  }
  // The CPU tier alone (an empty tier filter consults no secondary tier).
  LookupResult Primary(const OffloadKey& key) {
    RequestContext ctx = Ctx("primary-only");
    ctx.load_tier_filter = std::vector<TierMatcher>{};
    return m_->Lookup(key, ctx);
  }

  std::vector<std::string> log_;
  std::vector<std::shared_ptr<FakeTier>> tiers_;
  std::unique_ptr<OffloadManager> m_;
};

TEST_F(TieringTest, StoreReachesThePrimaryTier) {
  auto out = m_->PrepareStore(Range(0, 3), kCtx);
  ASSERT_TRUE(out.ok() && out->has_value());
  EXPECT_EQ((*out)->keys_to_store.size(), 3u);
  ASSERT_TRUE(m_->CompleteStore(Range(0, 3), kCtx).ok());
  for (const OffloadKey& k : Range(0, 3)) EXPECT_EQ(Primary(k), LookupResult::kHit);
  EXPECT_EQ(CountHits(Range(0, 3)), 3);
}

TEST_F(TieringTest, CompletedStoresCascadeToEveryTierWithTheRequest) {
  RequestContext ctx = Ctx("req_ctx");
  m_->OnNewRequest(ctx);
  Store(Range(0, 3), ctx);
  ASSERT_EQ(T(0).stores.size(), 1u);
  ASSERT_EQ(T(1).stores.size(), 1u);
  EXPECT_EQ(T(0).stores[0].keys, Range(0, 3));
  EXPECT_EQ(T(0).stores[0].req_id, "req_ctx");
  EXPECT_FALSE(T(0).stores[0].is_promotion);
  EXPECT_EQ(T(0).stores[0].slots, (std::vector<int32_t>{0, 1, 2}));
  for (const OffloadKey& k : Range(0, 3)) {
    EXPECT_EQ(T(0).Lookup(k, kCtx), LookupResult::kHit);
    EXPECT_EQ(T(1).Lookup(k, kCtx), LookupResult::kHit);
  }
}

TEST_F(TieringTest, CascadePinsCpuBlocksUntilTheJobsAreProcessed) {
  Store(Range(0, 3));
  for (const OffloadKey& k : Range(0, 3)) EXPECT_EQ(Ref(k), 2);  // one pin per tier
  EXPECT_EQ(m_->GetStats().active_cascade_jobs, 2u);
  // Step 1: prepare_store already polled this step; the finished cascades wait for the next.
  EndStep();
  for (const OffloadKey& k : Range(0, 3)) EXPECT_EQ(Ref(k), 2);
  EXPECT_TRUE(m_->HasPendingWork());
  EndStep();
  for (const OffloadKey& k : Range(0, 3)) EXPECT_EQ(Ref(k), 0);
  EXPECT_FALSE(m_->HasPendingWork());
  EXPECT_TRUE(OffloadManagerPeer::CheckInvariants(*m_).ok());
}

TEST_F(TieringTest, FailedStoreDoesNotCascade) {
  auto out = m_->PrepareStore(Range(0, 3), kCtx);
  ASSERT_TRUE(out.ok() && out->has_value());
  ASSERT_TRUE(m_->CompleteStore(Range(0, 3), kCtx, false).ok());
  EXPECT_TRUE(T(0).stores.empty());
  EXPECT_TRUE(T(1).stores.empty());
}

TEST_F(TieringTest, SecondaryHitIsPromotedAndHitsTwoStepsLater) {
  for (const OffloadKey& k : Range(0, 3)) T(0).blocks.insert(std::string(k.digest()));
  for (const OffloadKey& k : Range(0, 3)) {
    EXPECT_EQ(m_->Lookup(k, kCtx), LookupResult::kHitPending);
  }
  EXPECT_TRUE(T(0).loads.empty());  // sent at the end of the step
  EndStep();                        // flushes the promotion (the fake finishes it at once)
  ASSERT_EQ(T(0).loads.size(), 1u);
  EXPECT_TRUE(T(0).loads[0].is_promotion);
  EXPECT_EQ(T(0).loads[0].slots, (std::vector<int32_t>{0, 1, 2}));
  EndStep();  // processes it
  for (const OffloadKey& k : Range(0, 3)) EXPECT_EQ(Primary(k), LookupResult::kHit);
  EXPECT_EQ(CountHits(Range(0, 3)), 3);
  // A promotion is an ordinary CPU store: one stored event, and no cascade back.
  EXPECT_TRUE(T(0).stores.empty());
}

TEST_F(TieringTest, PromotionEventIsAnOrdinaryCpuStore) {
  T(0).blocks.insert(std::string(K(7).digest()));
  EXPECT_EQ(m_->Lookup(K(7), kCtx), LookupResult::kHitPending);
  m_->OnScheduleEnd();
  m_->OnScheduleEnd();
  std::vector<OffloadingEvent> events = m_->TakeEvents();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].medium, Medium::kCpu);
  EXPECT_FALSE(events[0].removed());
  EXPECT_EQ(events[0].keys, std::vector<OffloadKey>{K(7)});
}

class PartialPromotionTest : public TieringTest, public ::testing::WithParamInterface<bool> {};

TEST_P(PartialPromotionTest, OnlyTheSuccessfulKeysAreKept) {
  const bool partial = GetParam();
  const std::vector<OffloadKey> blocks = Range(0, 3);
  for (const OffloadKey& k : blocks) T(0).blocks.insert(std::string(k.digest()));
  T(0).load_result = [&](const TierJob& job) {
    JobResult r{job.job_id, false, std::nullopt, {}};
    if (partial) r.successful_keys = std::vector<OffloadKey>{blocks[0], blocks[2]};
    return r;
  };
  for (const OffloadKey& k : blocks) EXPECT_EQ(m_->Lookup(k, kCtx), LookupResult::kHitPending);
  EndStep();
  EndStep();
  const LookupResult hit = LookupResult::kHit, miss = LookupResult::kMiss;
  std::vector<LookupResult> expected = partial ? std::vector<LookupResult>{hit, miss, hit}
                                               : std::vector<LookupResult>{miss, miss, miss};
  std::vector<LookupResult> got;
  for (const OffloadKey& k : blocks) got.push_back(Primary(k));
  EXPECT_EQ(got, expected);
  EXPECT_EQ(m_->GetStats().promotion_job_failures, 1u);
  EXPECT_TRUE(OffloadManagerPeer::CheckInvariants(*m_).ok());
}

INSTANTIATE_TEST_SUITE_P(PartialAndFull, PartialPromotionTest, ::testing::Bool());

TEST_F(TieringTest, PromotionIntoAFullCpuTierIsAMissAndCounted) {
  Build(2);
  Store(Range(0, 2));  // both pinned by the cascade
  T(0).blocks.insert(std::string(K(9).digest()));
  EXPECT_EQ(m_->Lookup(K(9), kCtx), LookupResult::kMiss);
  EXPECT_EQ(m_->GetStats().promotion_allocation_failures, 1u);
}

TEST_F(TieringTest, RetryFromATierIsRetryUnlessALaterTierHits) {
  T(0).forced_lookup = LookupResult::kRetry;
  EXPECT_EQ(m_->Lookup(K(1), kCtx), LookupResult::kRetry);
  T(1).blocks.insert(std::string(K(1).digest()));
  EXPECT_EQ(m_->Lookup(K(1), kCtx), LookupResult::kHitPending);
}

TEST_F(TieringTest, PartialLookupCountsLeadingHits) {
  Store(Range(0, 3));
  EXPECT_EQ(CountHits(Range(0, 5)), 3);
}

TEST_F(TieringTest, EvictionInThePrimaryTierAfterCascadesFinish) {
  Store(Range(0, 5));
  EndStep();
  auto out = m_->PrepareStore(Range(5, 7), kCtx);
  ASSERT_TRUE(out.ok() && out->has_value());
  EXPECT_EQ((*out)->evicted_keys.size(), 2u);
  EXPECT_EQ((*out)->keys_to_store.size(), 2u);
}

TEST_F(TieringTest, TouchReachesEveryTier) {
  const std::vector<OffloadKey> blocks = Range(0, 3);
  Store(blocks);
  EndStep();
  EndStep();
  m_->Touch(blocks, kCtx);
  const auto& lru = dynamic_cast<LruPolicy&>(OffloadManagerPeer::CpuPolicy(*m_));
  std::vector<OffloadKey> order = lru.EvictableKeys();
  ASSERT_GE(order.size(), 3u);
  EXPECT_EQ(std::vector<OffloadKey>(order.end() - 3, order.end()),
            (std::vector<OffloadKey>{blocks[2], blocks[1], blocks[0]}));
  ASSERT_EQ(T(0).touched.size(), 1u);
  EXPECT_EQ(T(0).touched[0], blocks);
  EXPECT_EQ(T(1).touched[0], blocks);
}

TEST_F(TieringTest, PromotionsAreBatchedPerRequest) {
  for (const OffloadKey& k : Range(0, 4)) T(0).blocks.insert(std::string(k.digest()));
  const RequestContext a = Ctx("req_a"), b = Ctx("req_b");
  EXPECT_EQ(m_->Lookup(K(0), a), LookupResult::kHitPending);
  EXPECT_EQ(m_->Lookup(K(1), a), LookupResult::kHitPending);
  EXPECT_EQ(m_->Lookup(K(2), b), LookupResult::kHitPending);
  EXPECT_EQ(m_->Lookup(K(3), b), LookupResult::kHitPending);
  EXPECT_TRUE(T(0).loads.empty());
  EndStep();
  ASSERT_EQ(T(0).loads.size(), 2u);
  EXPECT_EQ(T(0).loads[0].keys, Range(0, 2));
  EXPECT_EQ(T(0).loads[0].req_id, "req_a");
  EXPECT_EQ(T(0).loads[1].keys, Range(2, 4));
  EXPECT_EQ(T(0).loads[1].req_id, "req_b");
}

TEST_F(TieringTest, ASharedKeyIsPromotedOnce) {
  T(0).blocks.insert(std::string(K(0).digest()));
  EXPECT_EQ(m_->Lookup(K(0), Ctx("req_a")), LookupResult::kHitPending);
  EXPECT_EQ(m_->Lookup(K(0), Ctx("req_b")), LookupResult::kHitPending);  // CPU slot in flight
  EndStep();
  ASSERT_EQ(T(0).loads.size(), 1u);
  EXPECT_EQ(T(0).loads[0].keys, std::vector<OffloadKey>{K(0)});
  EXPECT_EQ(T(0).loads[0].req_id, "req_a");
  EXPECT_EQ(T(0).lookups, 1);
}

TEST_F(TieringTest, SecondaryTiersHearOfTheEndAfterTheLastStoreIsSubmitted) {
  const RequestContext ctx = Ctx("req_delayed");
  m_->OnNewRequest(ctx);
  auto out = m_->PrepareStore(Range(0, 2), ctx);
  ASSERT_TRUE(out.ok() && out->has_value());
  m_->OnRequestFinished(ctx);
  EXPECT_TRUE(log_.empty());
  ASSERT_TRUE(m_->CompleteStore(Range(0, 2), ctx).ok());
  EXPECT_EQ(log_, (std::vector<std::string>{
                      "submit_store_1:req_delayed", "submit_store_2:req_delayed",
                      "secondary_finish_1:req_delayed", "secondary_finish_2:req_delayed"}));
}

TEST_F(TieringTest, AFailedStoreStillFinalisesAFinishedRequest) {
  const RequestContext ctx = Ctx("req_failed");
  m_->OnNewRequest(ctx);
  auto out = m_->PrepareStore(Range(0, 2), ctx);
  ASSERT_TRUE(out.ok() && out->has_value());
  m_->OnRequestFinished(ctx);
  EXPECT_TRUE(log_.empty());
  ASSERT_TRUE(m_->CompleteStore(Range(0, 2), ctx, false).ok());
  EXPECT_EQ(log_, (std::vector<std::string>{"secondary_finish_1:req_failed",
                                            "secondary_finish_2:req_failed"}));
}

TEST_F(TieringTest, ARequestWithoutStoresFinalisesAtOnce) {
  const RequestContext ctx = Ctx("req_zero");
  m_->OnNewRequest(ctx);
  m_->OnRequestFinished(ctx);
  EXPECT_EQ(log_, (std::vector<std::string>{"secondary_finish_1:req_zero",
                                            "secondary_finish_2:req_zero"}));
}

TEST_F(TieringTest, ResetFinalisesFinishedRequestsAndKeepsActiveOnes) {
  const RequestContext done = Ctx("req_done"), active = Ctx("req_active");
  m_->OnNewRequest(done);
  m_->OnNewRequest(active);
  ASSERT_TRUE(m_->PrepareStore(Range(0, 2), done).ok());
  ASSERT_TRUE(m_->PrepareStore(Range(2, 4), active).ok());
  m_->OnRequestFinished(done);
  EXPECT_TRUE(log_.empty());
  m_->ResetCache();
  EXPECT_EQ(log_, (std::vector<std::string>{"secondary_finish_1:req_done",
                                            "secondary_finish_2:req_done"}));
  log_.clear();
  // The active request's abandoned store no longer holds its finalisation back.
  Store(Range(4, 6), active);
  m_->OnRequestFinished(active);
  EXPECT_EQ(log_, (std::vector<std::string>{
                      "submit_store_1:req_active", "submit_store_2:req_active",
                      "secondary_finish_1:req_active", "secondary_finish_2:req_active"}));
}

TEST_F(TieringTest, RequestLevelPolicyIsReportedAndCascadesExistingBlocks) {
  const RequestContext plain = Ctx("req_plain");
  EXPECT_EQ(m_->OnNewRequest(plain), OffloadPolicy::kBlockLevel);
  m_->OnRequestFinished(plain);

  Store(Range(0, 3));
  EndStep();
  for (bool fully_warm : {true, false}) {
    SCOPED_TRACE(fully_warm ? "fully warm" : "mixed");
    T(0).policy = OffloadPolicy::kRequestLevel;
    T(0).stores.clear();
    T(1).stores.clear();
    const RequestContext ctx = Ctx(fully_warm ? "req_warm" : "req_mixed");
    EXPECT_EQ(m_->OnNewRequest(ctx), OffloadPolicy::kRequestLevel);
    std::vector<OffloadKey> keys = Range(0, 3);
    if (!fully_warm) keys.push_back(K(3));
    auto out = m_->PrepareStore(keys, ctx);
    ASSERT_TRUE(out.ok() && out->has_value());
    EXPECT_EQ((*out)->keys_to_store, fully_warm ? std::vector<OffloadKey>{} : Range(3, 4));
    // Only the request-level tier gets the existing blocks now; new ones come on completion.
    ASSERT_EQ(T(0).stores.size(), 1u);
    EXPECT_EQ(T(0).stores[0].keys, Range(0, 3));
    EXPECT_TRUE(T(1).stores.empty());
    if (!fully_warm) {
      ASSERT_TRUE(m_->CompleteStore(Range(3, 4), ctx).ok());
    }
    EndStep();
    EndStep();
  }
}

TEST_F(TieringTest, ResetDrainsTiersAndDropsUnsubmittedPromotions) {
  Store(Range(0, 3));
  T(0).blocks.insert(std::string(K(99).digest()));
  EXPECT_EQ(m_->Lookup(K(99), Ctx("pending")), LookupResult::kHitPending);
  EXPECT_TRUE(m_->HasPendingWork());
  m_->ResetCache();
  EXPECT_EQ(T(0).drains, 1);
  EXPECT_EQ(T(1).drains, 1);
  EXPECT_TRUE(T(0).loads.empty());  // the pending promotion was dropped, not submitted
  EXPECT_FALSE(m_->HasPendingWork());
  const ManagerStats s = m_->GetStats();
  EXPECT_EQ(s.num_allocated, 0u);
  EXPECT_EQ(s.num_stored, 0u);
  for (const OffloadKey& k : Range(0, 3)) EXPECT_EQ(Primary(k), LookupResult::kMiss);
  EXPECT_TRUE(OffloadManagerPeer::CheckInvariants(*m_).ok());
}

TEST_F(TieringTest, ResetRemovesTheCpuBlocksAndKeepsTheTiersAnnouncements) {
  Store(Range(0, 2));
  m_->TakeEvents();
  T(0).events.push_back(OffloadingEvent::Stored(Range(0, 2), Medium::kStorage));
  m_->ResetCache();
  std::vector<OffloadingEvent> events = m_->TakeEvents();
  // The tier's queued store first, then one CPU removal of the ready blocks; the blocks the tiers
  // still hold stay announced (no AllBlocksCleared, no re-announcement).
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].tier, 1);
  EXPECT_FALSE(events[0].removed());
  EXPECT_EQ(events[1].tier, 0);
  EXPECT_TRUE(events[1].removed());
  EXPECT_EQ(events[1].medium, Medium::kCpu);
  EXPECT_EQ(events[1].reason(), RemovalReason::kCleared);
  EXPECT_EQ(events[1].keys, Range(0, 2));
}

TEST_F(TieringTest, TierFilterSkipsNonMatchingTiers) {
  Store(Range(0, 1));
  T(0).blocks.insert(std::string(K(1).digest()));
  FakeTier& cpu_like = T(0);
  cpu_like.medium_ = Medium::kCpu;  // like vLLM's example tier
  for (auto filter : {std::vector<TierMatcher>{TierMatcher{Medium::kStorage, std::nullopt}},
                      std::vector<TierMatcher>{}}) {
    RequestContext ctx = Ctx("r1");
    ctx.load_tier_filter = filter;
    const int before = cpu_like.lookups;
    EXPECT_EQ(m_->Lookup(K(0), ctx), LookupResult::kHit);
    EXPECT_EQ(m_->Lookup(K(1), ctx), LookupResult::kMiss);  // held only by a skipped tier
    EXPECT_EQ(cpu_like.lookups, before);
  }
  for (auto filter : {std::optional<std::vector<TierMatcher>>{},
                      std::optional<std::vector<TierMatcher>>{{TierMatcher{Medium::kCpu, {}}}},
                      std::optional<std::vector<TierMatcher>>{{TierMatcher{}}}}) {
    Build(5);
    T(0).medium_ = Medium::kCpu;
    T(0).blocks.insert(std::string(K(1).digest()));
    RequestContext ctx = Ctx("r2");
    ctx.load_tier_filter = filter;
    EXPECT_EQ(m_->Lookup(K(1), ctx), LookupResult::kHitPending);
    EXPECT_EQ(T(0).lookups, 1);
  }
}

TEST_F(TieringTest, EventsComePrimaryFirstThenEachTier) {
  T(0).events.push_back(OffloadingEvent::Stored(Range(2, 3), Medium::kStorage));
  T(1).events.push_back(
      OffloadingEvent::Removed(Range(3, 4), Medium::kStorage, RemovalReason::kEvicted));
  Store(Range(1, 2));
  std::vector<OffloadingEvent> events = m_->TakeEvents();
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].medium, Medium::kCpu);
  EXPECT_EQ(events[0].tier, 0);
  EXPECT_EQ(events[1].keys, Range(2, 3));
  EXPECT_EQ(events[1].tier, 1);
  EXPECT_EQ(events[2].keys, Range(3, 4));
  EXPECT_EQ(events[2].tier, 2);
}

TEST_F(TieringTest, StoreThresholdIsRejectedWithTiers) {
  ManagerOptions o;
  o.num_blocks = 4;
  o.store_threshold = 2;
  o.secondary_tiers.push_back(std::make_shared<FakeTier>("x", nullptr));
  auto m = OffloadManager::Create(std::move(o));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("store_threshold=2"), std::string::npos);
}

TEST(TieringNoTiersTest, WorksAsAPlainManager) {
  ManagerOptions o;
  o.num_blocks = 5;
  auto m = std::move(OffloadManager::Create(std::move(o))).value();
  m->OnNewRequest(kCtx);
  auto out = m->PrepareStore(Range(0, 3), kCtx);
  ASSERT_TRUE(out.ok() && out->has_value());
  ASSERT_TRUE(m->CompleteStore(Range(0, 3), kCtx).ok());
  for (const OffloadKey& k : Range(0, 3)) EXPECT_EQ(m->Lookup(k, kCtx), LookupResult::kHit);
  EXPECT_FALSE(m->HasPendingWork());
}

// ---- IndexedTier: a bounded tier over a transport ----

class IndexedTierTest : public ::testing::Test {
 protected:
  void Build(uint64_t max_blocks, size_t cpu_blocks = 8) {
    IndexedTierOptions to;
    to.name = "fs";
    to.locality = "LOCAL";
    to.max_bytes = max_blocks * 100;
    to.block_bytes = 100;
    auto tier = IndexedTier::Create(to, transport_);
    ASSERT_TRUE(tier.ok()) << tier.status().ToString();
    tier_ = std::shared_ptr<IndexedTier>(std::move(tier).value());
    ManagerOptions o;
    o.num_blocks = cpu_blocks;
    o.track_blocks = true;
    o.secondary_tiers.push_back(tier_);
    m_ = std::move(OffloadManager::Create(std::move(o))).value();
  }
  void Store(const std::vector<OffloadKey>& keys) {
    auto out = m_->PrepareStore(keys, kCtx);
    ASSERT_TRUE(out.ok() && out->has_value());
    ASSERT_TRUE(m_->CompleteStore(keys, kCtx).ok());
  }
  std::vector<OffloadingEvent> Storage() {
    std::vector<OffloadingEvent> out;
    for (OffloadingEvent& e : m_->TakeEvents()) {
      if (e.medium == Medium::kStorage) out.push_back(std::move(e));
    }
    return out;
  }

  std::shared_ptr<FakeTransport> transport_ = std::make_shared<FakeTransport>();
  std::shared_ptr<IndexedTier> tier_;
  std::unique_ptr<OffloadManager> m_;
};

TEST_F(IndexedTierTest, StoresLandAsStorageEventsWhenTheTransportFinishes) {
  Build(4);
  Store(Range(0, 3));
  EXPECT_TRUE(Storage().empty());
  EXPECT_EQ(tier_->Lookup(K(0), kCtx), LookupResult::kMiss);  // still being written
  transport_->FinishAll();
  m_->OnScheduleEnd();  // the step's poll already happened in prepare_store
  m_->OnScheduleEnd();
  std::vector<OffloadingEvent> events = Storage();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].keys, Range(0, 3));
  EXPECT_FALSE(events[0].removed());
  EXPECT_EQ(events[0].locality, "LOCAL");
  EXPECT_EQ(events[0].tier, 1);
  EXPECT_EQ(tier_->Lookup(K(0), kCtx), LookupResult::kHit);
  EXPECT_EQ(tier_->index().used_bytes(), 300u);
}

TEST_F(IndexedTierTest, ABoundedTierEvictsByItsPolicyAndPublishesRemovals) {
  Build(3);
  Store(Range(0, 3));
  transport_->FinishAll();
  m_->OnScheduleEnd();
  m_->OnScheduleEnd();
  Storage();
  tier_->Touch(Range(0, 1), kCtx);  // 0 most recent: 1 is the LRU victim
  Store(Range(3, 5));
  std::vector<OffloadingEvent> events = Storage();
  ASSERT_EQ(events.size(), 1u);  // the removal comes at submission, before the store lands
  EXPECT_TRUE(events[0].removed());
  EXPECT_EQ(events[0].reason(), RemovalReason::kEvicted);
  EXPECT_EQ(events[0].keys, (std::vector<OffloadKey>{K(1), K(2)}));
  EXPECT_EQ(transport_->deleted, (std::vector<OffloadKey>{K(1), K(2)}));
  transport_->FinishAll();
  m_->OnScheduleEnd();
  m_->OnScheduleEnd();
  events = Storage();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].keys, Range(3, 5));
  EXPECT_LE(tier_->index().used_bytes(), 300u);
  EXPECT_TRUE(tier_->index().CheckInvariants().ok());
}

TEST_F(IndexedTierTest, AFullTierRejectsStoresAndTheCascadeReleasesItsPins) {
  Build(1);
  Store(Range(0, 1));
  Store(Range(1, 2));  // no room: block 0 is being written
  EXPECT_EQ(tier_->stores_rejected(), 1u);
  transport_->FinishAll();
  m_->OnScheduleEnd();
  m_->OnScheduleEnd();
  EXPECT_EQ(m_->GetStats().cascade_job_failures, 1u);  // the rejected job reports failure
  EXPECT_EQ(m_->GetStats().active_cascade_jobs, 0u);   // and its CPU pins are released
  EXPECT_EQ(m_->GetStats().num_evictable, 2u);
}

TEST_F(IndexedTierTest, FailedStoreLeavesNoTraceAndNoEvent) {
  Build(4);
  Store(Range(0, 2));
  transport_->Finish(transport_->submitted[0].job_id, false, std::vector<OffloadKey>{K(1)});
  m_->OnScheduleEnd();
  m_->OnScheduleEnd();
  std::vector<OffloadingEvent> events = Storage();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].keys, Range(1, 2));  // only the key that made it
  EXPECT_EQ(tier_->Lookup(K(0), kCtx), LookupResult::kMiss);
  EXPECT_EQ(tier_->index().size(), 1u);
}

TEST_F(IndexedTierTest, PromotionThroughTheTierAndACorruptBlockIsDroppedAndPublished) {
  Build(4, /*cpu_blocks=*/4);
  transport_->Put(K(0));
  transport_->Put(K(1));
  Build(4, 4);  // the index is rebuilt from the medium
  EXPECT_EQ(tier_->index().size(), 2u);
  EXPECT_EQ(m_->Lookup(K(0), kCtx), LookupResult::kHitPending);
  EXPECT_EQ(m_->Lookup(K(1), kCtx), LookupResult::kHitPending);
  m_->OnScheduleEnd();
  ASSERT_EQ(transport_->submitted.size(), 1u);
  EXPECT_TRUE(transport_->submitted[0].is_promotion);
  transport_->Finish(transport_->submitted[0].job_id, false, std::vector<OffloadKey>{K(0)}, {K(1)});
  m_->OnScheduleEnd();
  std::vector<OffloadingEvent> all = m_->TakeEvents();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].medium, Medium::kCpu);  // 0 landed in CPU
  EXPECT_EQ(all[0].keys, std::vector<OffloadKey>{K(0)});
  EXPECT_EQ(all[1].medium, Medium::kStorage);  // 1 was corrupt: dropped and announced
  EXPECT_TRUE(all[1].removed());
  EXPECT_EQ(all[1].reason(), RemovalReason::kFailed);
  EXPECT_EQ(tier_->Lookup(K(1), kCtx), LookupResult::kMiss);
  RequestContext cpu_only = kCtx;
  cpu_only.load_tier_filter = std::vector<TierMatcher>{};
  EXPECT_EQ(m_->Lookup(K(0), cpu_only), LookupResult::kHit);
  EXPECT_EQ(m_->Lookup(K(1), cpu_only), LookupResult::kMiss);
  EXPECT_TRUE(OffloadManagerPeer::CheckInvariants(*m_).ok());
}

// A promotion promised by a lookup holds its block until the load is submitted; a reset that drops
// the promotion unsubmitted releases the hold (else the block stays pinned and the full tier
// rejects every later store).
TEST_F(IndexedTierTest, AResetReleasesTheHoldOfAnUnsubmittedPromotion) {
  transport_->Put(K(0));
  transport_->Put(K(1));
  Build(2, 4);
  ASSERT_EQ(m_->Lookup(K(0), kCtx), LookupResult::kHitPending);
  m_->ResetCache();  // the promotion is dropped before the step's end
  Store(Range(2, 3));
  Store(Range(3, 4));  // room again for both: 0 and 1 are evictable
  EXPECT_EQ(tier_->stores_rejected(), 0u);
  EXPECT_EQ(tier_->index().size(), 2u);
  EXPECT_EQ(transport_->deleted.size(), 2u);
  EXPECT_TRUE(tier_->index().CheckInvariants().ok());
}

// An evicted block whose delete failed is not forgotten (its file would stay on the medium outside
// the budget): the delete is retried at the steps' ends; a key stored again meanwhile is dropped
// from the retries (its file is then the block's own).
TEST_F(IndexedTierTest, AFailedEvictionDeleteIsRetriedUntilItSucceeds) {
  Build(2, 8);
  Store(Range(0, 2));
  transport_->FinishAll();
  m_->OnScheduleEnd();
  m_->OnScheduleEnd();
  transport_->fail_deletes = true;
  Store(Range(2, 4));  // evicts 0 and 1; their deletes fail
  EXPECT_EQ(tier_->undeleted(), 2u);
  transport_->FinishAll();
  m_->OnScheduleEnd();  // the retries fail too: still pending
  m_->OnScheduleEnd();  // (the stores of 2 and 3 are collected now)
  EXPECT_EQ(tier_->undeleted(), 2u);
  EXPECT_EQ(transport_->medium.count(K(0).VllmBytes()), 1u);
  transport_->fail_deletes = false;
  // 1 is stored again before a retry succeeds (it evicts 2 from the tier): never deleted now.
  tier_->Touch(Range(3, 4), kCtx);
  TierJob again;
  again.job_id = 1000;
  again.keys = {K(1)};
  again.slots = {0};
  ASSERT_TRUE(tier_->SubmitStore(again).ok());
  EXPECT_EQ(tier_->undeleted(), 1u);
  m_->OnScheduleEnd();  // the retry of 0 succeeds
  EXPECT_EQ(tier_->undeleted(), 0u);
  EXPECT_EQ(transport_->medium.count(K(0).VllmBytes()), 0u);
  EXPECT_EQ(transport_->medium.count(K(1).VllmBytes()), 1u);
  EXPECT_EQ(std::count(transport_->deleted.begin(), transport_->deleted.end(), K(1)), 0);
}

TEST_F(IndexedTierTest, StartupTrimsTheMediumToTheBudget) {
  for (int i = 0; i < 5; ++i) transport_->Put(K(i));
  Build(3);
  EXPECT_EQ(tier_->index().size(), 3u);
  EXPECT_EQ(transport_->medium.size(), 3u);
  EXPECT_EQ(transport_->deleted.size(), 2u);
}

// A bound past what the policy's table holds is refused by name (an LRU tier used to accept it
// and abort the process once the table grew past its 28-bit limit); an unbounded tier is capped
// there.
TEST(IndexedTierCreateTest, RejectsABoundPastThePolicysLimitAndCapsAnUnboundedTier) {
  IndexedTierOptions to;
  to.block_bytes = 16384;
  to.max_bytes = (kMaxLruBlocks + 1) * to.block_bytes;
  auto lru = IndexedTier::Create(to, std::make_shared<FakeTransport>());
  ASSERT_FALSE(lru.ok());
  EXPECT_EQ(lru.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(lru.status().message().find("at most 33554432 with the 'lru' policy"),
            std::string::npos)
      << lru.status().ToString();
  to.max_bytes = kMaxLruBlocks * to.block_bytes;  // 512 GiB of 16 KiB blocks: fine
  EXPECT_TRUE(IndexedTier::Create(to, std::make_shared<FakeTransport>()).ok());
  to.eviction_policy = "arc";
  auto arc = IndexedTier::Create(to, std::make_shared<FakeTransport>());
  ASSERT_FALSE(arc.ok());
  EXPECT_NE(arc.status().message().find("at most 8388608 with the 'arc' policy"), std::string::npos)
      << arc.status().ToString();
  to.eviction_policy = "lru";
  to.max_bytes = 0;
  auto unbounded = IndexedTier::Create(to, std::make_shared<FakeTransport>());
  ASSERT_TRUE(unbounded.ok()) << unbounded.status().ToString();
  EXPECT_EQ((*unbounded)->index().capacity_blocks(), kMaxLruBlocks);
}

TEST(IndexedTierCreateTest, RejectsABudgetBelowOneBlock) {
  IndexedTierOptions to;
  to.max_bytes = 10;
  to.block_bytes = 100;
  auto t = IndexedTier::Create(to, std::make_shared<FakeTransport>());
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("max_bytes=10"), std::string::npos);
}

}  // namespace
}  // namespace kvo
