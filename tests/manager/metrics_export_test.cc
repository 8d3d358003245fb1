// OffloadMetricsExporter: a manager driven through known operations, then the exposition text must
// hold the exact samples (vLLM's families from ManagerStats, the tiering family per tier label with
// the lookup-delay histograms timed on a ManualClock, and kvo's own families).
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/metrics.h"
#include "events/journal.h"
#include "manager/metrics.h"
#include "manager/offload_manager.h"
#include "manager/secondary_tier.h"
#include "tests/testing/fake_jobs.h"
#include "tests/testing/manual_clock.h"
#include "tests/testing/temp_dir.h"

namespace kvo {
namespace {

OffloadKey K(int i) { return OffloadKey::FromDigest("key" + std::to_string(i), 0); }
std::vector<OffloadKey> Keys(int from, int to) {
  std::vector<OffloadKey> out;
  for (int i = from; i < to; ++i) out.push_back(K(i));
  return out;
}

// Expects `line` (a whole sample line, "\n" added) in the exposition.
void ExpectSample(const std::string& text, const std::string& line) {
  EXPECT_NE(text.find(line + "\n"), std::string::npos) << "missing: " << line << "\n" << text;
}

TEST(MetricsExportTest, CpuManagerCountersGaugesAndEvents) {
  testing::TempDir dir;
  JournalOptions jo;
  jo.dir = dir.path() + "/journal";
  auto journal = Journal::Open(jo);
  ASSERT_TRUE(journal.ok()) << journal.status().ToString();

  ManagerOptions o;
  o.num_blocks = 4;
  o.journal = journal->get();
  auto created = OffloadManager::Create(std::move(o));
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  std::unique_ptr<OffloadManager> m = std::move(created).value();

  MetricsRegistry registry;
  auto exporter = OffloadMetricsExporter::Create(&registry, {});
  ASSERT_TRUE(exporter.ok()) << exporter.status().ToString();
  OffloadMetricsExporter& e = **exporter;

  const RequestContext ctx;
  // 2 new blocks (allocation 2), stored.
  auto a = m->PrepareStore(Keys(1, 3), ctx);
  ASSERT_TRUE(a.ok() && a->has_value());
  ASSERT_TRUE(m->CompleteStore(Keys(1, 3), ctx).ok());
  // 3 new blocks with 2 free slots: K1 (LRU) evicted; allocation 3.
  auto b = m->PrepareStore(Keys(3, 6), ctx);
  ASSERT_TRUE(b.ok() && b->has_value());
  ASSERT_EQ((*b)->evicted_keys, std::vector<OffloadKey>{K(1)});
  ASSERT_TRUE(m->CompleteStore(Keys(3, 6), ctx).ok());
  ASSERT_TRUE(m->PublishEvents().ok());  // 5 stored + 1 evicted, journaled
  // K2 pinned by a load: usage 1/4, all of it read usage.
  ASSERT_TRUE(m->PrepareLoad(Keys(2, 3), ctx).ok());
  // 5 new blocks, 3 evictable: cannot store (allocation 5 recorded, one failure).
  auto c = m->PrepareStore(Keys(6, 11), ctx);
  ASSERT_TRUE(c.ok());
  ASSERT_FALSE(c->has_value());

  ASSERT_TRUE(e.Export(m->GetStats()).ok());
  std::string text = registry.RenderPrometheus();
  ExpectSample(text, "vllm:kv_offload_allocation_failure_total 1.0");
  ExpectSample(text, "vllm:kv_offload_cpu_cache_usage_perc 0.25");
  ExpectSample(text, "vllm:kv_offload_cpu_cache_write_usage_perc 0.0");
  ExpectSample(text, "vllm:kv_offload_cpu_cache_read_usage_perc 0.25");
  ExpectSample(text, "vllm:kv_offload_cpu_allocation_size_bucket{le=\"1.0\"} 0.0");
  ExpectSample(text, "vllm:kv_offload_cpu_allocation_size_bucket{le=\"4.0\"} 2.0");
  ExpectSample(text, "vllm:kv_offload_cpu_allocation_size_bucket{le=\"16.0\"} 3.0");
  ExpectSample(text, "vllm:kv_offload_cpu_allocation_size_bucket{le=\"+Inf\"} 3.0");
  ExpectSample(text, "vllm:kv_offload_cpu_allocation_size_count 3.0");
  ExpectSample(text, "vllm:kv_offload_cpu_allocation_size_sum 10.0");
  ExpectSample(text, "kvo:offload_events_total{medium=\"CPU\",kind=\"stored\"} 5.0");
  ExpectSample(text, "kvo:offload_events_total{medium=\"CPU\",kind=\"evicted\"} 1.0");
  ExpectSample(text, "kvo:offload_events_published_total 6.0");
  ExpectSample(text, "kvo:offload_event_errors_total 0.0");
  ASSERT_GT((*journal)->total_bytes(), 0u);
  ExpectSample(text, "kvo:offload_journal_bytes " +
                         FormatMetricValue(static_cast<double>((*journal)->total_bytes())));
  // No tiers: no tiering family, and no series for kinds that never happened.
  EXPECT_EQ(text.find("vllm:kv_offload_tiering"), std::string::npos);
  EXPECT_EQ(text.find("kind=\"failed\""), std::string::npos);

  // Exporting the same cumulative stats again adds nothing.
  ASSERT_TRUE(e.Export(m->GetStats()).ok());
  EXPECT_EQ(registry.RenderPrometheus(), text);

  // Later operations advance by their difference: unpin K2, a store of K20 (allocation 1) that
  // evicts K3 and then fails (no stored event), a reset (one CPU removal of the ready K2, K4, K5:
  // three blocks "cleared").
  ASSERT_TRUE(m->CompleteLoad(Keys(2, 3), ctx).ok());
  auto d = m->PrepareStore(Keys(20, 21), ctx);
  ASSERT_TRUE(d.ok() && d->has_value());
  ASSERT_EQ((*d)->evicted_keys, std::vector<OffloadKey>{K(3)});  // K2 went back to MRU
  ASSERT_TRUE(m->CompleteStore(Keys(20, 21), ctx, false).ok());
  m->ResetCache();
  ASSERT_TRUE(m->PublishEvents().ok());
  ASSERT_TRUE(e.Export(m->GetStats()).ok());
  text = registry.RenderPrometheus();
  ExpectSample(text, "vllm:kv_offload_allocation_failure_total 1.0");
  ExpectSample(text, "vllm:kv_offload_cpu_cache_usage_perc 0.0");
  ExpectSample(text, "vllm:kv_offload_cpu_cache_read_usage_perc 0.0");
  ExpectSample(text, "vllm:kv_offload_cpu_allocation_size_bucket{le=\"1.0\"} 1.0");
  ExpectSample(text, "vllm:kv_offload_cpu_allocation_size_count 4.0");
  ExpectSample(text, "vllm:kv_offload_cpu_allocation_size_sum 11.0");
  ExpectSample(text, "kvo:offload_events_total{medium=\"CPU\",kind=\"stored\"} 5.0");
  ExpectSample(text, "kvo:offload_events_total{medium=\"CPU\",kind=\"evicted\"} 2.0");
  ExpectSample(text, "kvo:offload_events_total{medium=\"CPU\",kind=\"cleared\"} 3.0");
  // 5 BlockStored + 3 BlockRemoved (two evictions, the reset).
  ExpectSample(text, "kvo:offload_events_published_total 8.0");
}

TEST(MetricsExportTest, StoresSkippedWithStoreThreshold) {
  ManagerOptions o;
  o.num_blocks = 8;
  o.store_threshold = 2;
  auto created = OffloadManager::Create(std::move(o));
  ASSERT_TRUE(created.ok());
  std::unique_ptr<OffloadManager> m = std::move(created).value();
  MetricsRegistry registry;
  OffloadMetricsOptions mo;
  mo.store_threshold_enabled = true;
  auto exporter = OffloadMetricsExporter::Create(&registry, mo);
  ASSERT_TRUE(exporter.ok());
  const RequestContext ctx;
  (void)m->Lookup(K(1), ctx);
  (void)m->Lookup(K(1), ctx);  // K1 counted twice: stored; K2, K3 once or never: skipped
  (void)m->Lookup(K(2), ctx);
  auto out = m->PrepareStore(Keys(1, 4), ctx);
  ASSERT_TRUE(out.ok() && out->has_value());
  EXPECT_EQ((*out)->keys_to_store, std::vector<OffloadKey>{K(1)});
  ASSERT_TRUE((*exporter)->Export(m->GetStats()).ok());
  ExpectSample(registry.RenderPrometheus(), "vllm:kv_offload_stores_skipped_total 2.0");
}

// A secondary tier whose lookups take `lookup_micros` on the manual clock and answer `answer`;
// load jobs finish when the test says.
class TimedTier final : public SecondaryTier, public testing::FakeJobs<TierJob, JobResult> {
 public:
  explicit TimedTier(testing::ManualClock* clock) : clock_(clock) {}
  const std::string& name() const override { return name_; }
  const std::optional<std::string>& locality() const override { return locality_; }
  LookupResult Lookup(const OffloadKey& /*key*/, const RequestContext& /*ctx*/) override {
    clock_->AdvanceMicros(lookup_micros);
    return answer;
  }
  Status SubmitStore(const TierJob& job) override {
    Post(JobResult{job.job_id, true, std::nullopt, {}});
    return Status::Ok();
  }
  Status SubmitLoad(const TierJob& job) override {
    loads.push_back(job);
    return Status::Ok();
  }
  void TakeFinished(std::vector<JobResult>* out) override { FakeJobs::TakeFinished(out); }
  void Drain() override {}
  void ListHeld(std::vector<OffloadKey>* /*out*/) const override {}

  LookupResult answer = LookupResult::kMiss;
  int64_t lookup_micros = 200;
  std::vector<TierJob> loads;

 private:
  testing::ManualClock* clock_;
  std::string name_ = "fs";
  std::optional<std::string> locality_;
};

TEST(MetricsExportTest, TieringFamilyPerTierWithLookupDelays) {
  testing::ManualClock clock;
  auto tier = std::make_shared<TimedTier>(&clock);
  ManagerOptions o;
  o.num_blocks = 4;
  o.clock = &clock;
  o.secondary_tiers.push_back(tier);
  auto created = OffloadManager::Create(std::move(o));
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  std::unique_ptr<OffloadManager> m = std::move(created).value();
  MetricsRegistry registry;
  OffloadMetricsOptions mo;
  mo.tiering = true;
  auto exporter = OffloadMetricsExporter::Create(&registry, mo);
  ASSERT_TRUE(exporter.ok());
  RequestContext ctx;
  ctx.req_id = "r";

  // K1: the tier says RETRY (200 us), then 2 ms later MISS (200 us): one async delay of
  // 2.2 ms (first RETRY answered .. verdict answered).
  tier->answer = LookupResult::kRetry;
  EXPECT_EQ(m->Lookup(K(1), ctx), LookupResult::kRetry);
  clock.AdvanceMicros(2000);
  tier->answer = LookupResult::kMiss;
  EXPECT_EQ(m->Lookup(K(1), ctx), LookupResult::kMiss);
  // K2: a tier HIT starts a promotion (HIT_PENDING): one CPU slot written for tier 1:fs.
  tier->answer = LookupResult::kHit;
  EXPECT_EQ(m->Lookup(K(2), ctx), LookupResult::kHitPending);

  ASSERT_TRUE((*exporter)->Export(m->GetStats()).ok());
  std::string text = registry.RenderPrometheus();
  const std::string p = "{tier=\"0:primary\"}";
  const std::string fs = "{tier=\"1:fs\"}";
  ExpectSample(text, "vllm:kv_offload_tiering_chunk_queries_total" + p + " 3.0");
  ExpectSample(text, "vllm:kv_offload_tiering_chunk_queries_total" + fs + " 3.0");
  ExpectSample(text, "vllm:kv_offload_tiering_chunk_hits_total" + p + " 0.0");
  ExpectSample(text, "vllm:kv_offload_tiering_chunk_hits_total" + fs + " 1.0");
  // Sync delay: the CPU tier takes no time on the manual clock (le 1e-05), the tier 200 us each.
  ExpectSample(text,
               "vllm:kv_offload_tiering_lookup_sync_delay_seconds_bucket{tier=\"0:primary\","
               "le=\"1e-05\"} 3.0");
  ExpectSample(text, "vllm:kv_offload_tiering_lookup_sync_delay_seconds_sum" + p + " 0.0");
  ExpectSample(text,
               "vllm:kv_offload_tiering_lookup_sync_delay_seconds_bucket{tier=\"1:fs\","
               "le=\"0.0001\"} 0.0");
  ExpectSample(text,
               "vllm:kv_offload_tiering_lookup_sync_delay_seconds_bucket{tier=\"1:fs\","
               "le=\"0.0005\"} 3.0");
  ExpectSample(text, "vllm:kv_offload_tiering_lookup_sync_delay_seconds_count" + fs + " 3.0");
  ExpectSample(text, "vllm:kv_offload_tiering_lookup_sync_delay_seconds_sum" + fs + " " +
                         FormatMetricValue(200000 / 1e9 + 200000 / 1e9 + 200000 / 1e9));
  ExpectSample(text,
               "vllm:kv_offload_tiering_lookup_async_delay_seconds_bucket{tier=\"1:fs\","
               "le=\"0.001\"} 0.0");
  ExpectSample(text,
               "vllm:kv_offload_tiering_lookup_async_delay_seconds_bucket{tier=\"1:fs\","
               "le=\"0.005\"} 1.0");
  ExpectSample(text, "vllm:kv_offload_tiering_lookup_async_delay_seconds_sum" + fs + " " +
                         FormatMetricValue(2200000 / 1e9));
  ExpectSample(text, "vllm:kv_offload_tiering_lookup_async_delay_seconds_count" + p + " 0.0");
  ExpectSample(text, "vllm:kv_offload_tiering_primary_write_usage_perc" + fs + " 0.25");
  ExpectSample(text, "vllm:kv_offload_tiering_primary_read_usage_perc" + fs + " 0.0");
  ExpectSample(text, "vllm:kv_offload_tiering_active_promotion_jobs" + fs + " 0.0");

  // End of step: the promotion job is sent; then it fails.
  m->OnScheduleEnd();
  ASSERT_EQ(tier->loads.size(), 1u);
  ASSERT_TRUE((*exporter)->Export(m->GetStats()).ok());
  text = registry.RenderPrometheus();
  ExpectSample(text, "vllm:kv_offload_tiering_active_promotion_jobs" + fs + " 1.0");
  ExpectSample(text, "vllm:kv_offload_tiering_primary_write_usage_perc" + fs + " 0.25");
  tier->finished.push_back(JobResult{tier->loads[0].job_id, false, std::nullopt, {}});
  m->OnScheduleEnd();
  ASSERT_TRUE((*exporter)->Export(m->GetStats()).ok());
  text = registry.RenderPrometheus();
  ExpectSample(text, "vllm:kv_offload_tiering_active_promotion_jobs" + fs + " 0.0");
  ExpectSample(text, "vllm:kv_offload_tiering_primary_write_usage_perc" + fs + " 0.0");
  ExpectSample(text, "vllm:kv_offload_tiering_promotion_job_failures_total" + fs + " 1.0");
  ExpectSample(text, "vllm:kv_offload_tiering_promotion_job_failures_total" + p + " 0.0");
  ExpectSample(text, "vllm:kv_offload_tiering_promotion_allocation_failures_total 0.0");
}

TEST(MetricsExportTest, HistogramAddBucketedChecksTheSize) {
  Histogram h({1, 2});
  EXPECT_FALSE(h.AddBucketed({1, 2}, 3).ok());
  ASSERT_TRUE(h.AddBucketed({1, 0, 2}, 7.5).ok());
  const Histogram::Snapshot s = h.Take();
  EXPECT_EQ(s.cumulative, (std::vector<uint64_t>{1, 1, 3}));
  EXPECT_EQ(s.count, 3u);
  EXPECT_EQ(s.sum, 7.5);
}

}  // namespace
}  // namespace kvo

namespace kvo {
namespace {

// The connector's transfer families, fed per finished transfer (vLLM's worker-side stats): stores
// are GPU -> CPU, loads CPU -> GPU; sizes land in vLLM's 1e6 .. 2e8 byte buckets (values render as
// prometheus_client writes them: 4e+06); failures do not count.
TEST(MetricsExportTest, TransfersFeedTheConnectorFamilies) {
  MetricsRegistry registry;
  auto exporter = OffloadMetricsExporter::Create(&registry, {});
  ASSERT_TRUE(exporter.ok()) << exporter.status().ToString();
  OffloadMetricsExporter& e = **exporter;
  TransferResult store;
  store.direction = TransferDirection::kGpuToCpu;
  store.success = true;
  store.bytes = 2'000'000;
  store.seconds = 0.25;
  e.RecordTransfer(store);
  e.RecordTransfer(store);
  TransferResult load = store;
  load.direction = TransferDirection::kCpuToGpu;
  load.bytes = 500'000;
  load.seconds = 0.5;
  e.RecordTransfer(load);
  TransferResult failed = load;
  failed.success = false;
  e.RecordTransfer(failed);
  const std::string text = registry.RenderPrometheus();
  ExpectSample(text, "vllm:kv_offload_store_bytes_total 4e+06");
  ExpectSample(text, "vllm:kv_offload_store_time_total 0.5");
  ExpectSample(text, "vllm:kv_offload_store_size_count 2.0");
  ExpectSample(text, "vllm:kv_offload_load_bytes_total 500000.0");
  ExpectSample(text, "vllm:kv_offload_load_time_total 0.5");
  ExpectSample(text, "vllm:kv_offload_load_size_count 1.0");
  ExpectSample(text, "vllm:kv_offload_load_size_bucket{le=\"1e+06\"} 1.0");
}

}  // namespace
}  // namespace kvo
