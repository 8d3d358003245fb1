#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "common/metrics.h"
#include "manager/metrics.h"

namespace kvo {
namespace {

// B.12, written out by hand so that a typo in manager/metrics.h cannot hide.
const std::vector<std::string> kConnectorNames = {
    "vllm:kv_offload_load_bytes",
    "vllm:kv_offload_load_time",
    "vllm:kv_offload_load_size",
    "vllm:kv_offload_store_bytes",
    "vllm:kv_offload_store_time",
    "vllm:kv_offload_store_size",
    "vllm:kv_offload_lookup_sync_delay_seconds",
    "vllm:kv_offload_lookup_async_delay_seconds",
    "vllm:kv_offload_allocation_failure",
};
const std::vector<std::string> kCpuNames = {
    "vllm:kv_offload_cpu_cache_usage_perc",
    "vllm:kv_offload_cpu_cache_write_usage_perc",
    "vllm:kv_offload_cpu_cache_read_usage_perc",
    "vllm:kv_offload_cpu_allocation_size",
};
const char kStoresSkipped[] = "vllm:kv_offload_stores_skipped";
const std::vector<std::string> kTieringNames = {
    "vllm:kv_offload_tiering_lookup_sync_delay_seconds",
    "vllm:kv_offload_tiering_lookup_async_delay_seconds",
    "vllm:kv_offload_tiering_read_bytes",
    "vllm:kv_offload_tiering_read_time",
    "vllm:kv_offload_tiering_write_bytes",
    "vllm:kv_offload_tiering_write_time",
    "vllm:kv_offload_tiering_promotion_job_failures",
    "vllm:kv_offload_tiering_cascade_job_failures",
    "vllm:kv_offload_tiering_chunk_queries",
    "vllm:kv_offload_tiering_chunk_hits",
    "vllm:kv_offload_tiering_primary_write_usage_perc",
    "vllm:kv_offload_tiering_primary_read_usage_perc",
    "vllm:kv_offload_tiering_active_promotion_jobs",
    "vllm:kv_offload_tiering_active_cascade_jobs",
    "vllm:kv_offload_tiering_promotion_allocation_failures",
};

std::set<std::string> Names(const MetricsRegistry& registry) {
  std::vector<std::string> v = registry.FamilyNames();
  return {v.begin(), v.end()};
}

std::set<std::string> Union(std::initializer_list<std::vector<std::string>> lists) {
  std::set<std::string> out;
  for (const auto& l : lists) out.insert(l.begin(), l.end());
  return out;
}

bool Contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

TEST(OffloadMetricsNamesTest, CpuSpecRegistersExactlyVllmsNames) {
  MetricsRegistry registry;
  auto metrics = RegisterOffloadMetrics(&registry, {});
  ASSERT_TRUE(metrics.ok()) << metrics.status().ToString();
  EXPECT_EQ(Names(registry), Union({kConnectorNames, kCpuNames}));
  EXPECT_EQ(metrics->stores_skipped, nullptr);  // only with store_threshold >= 2
  EXPECT_EQ(metrics->tiering_promotion_allocation_failures, nullptr);
  EXPECT_FALSE(metrics->ForTier(PrimaryTierLabel()).ok());
}

TEST(OffloadMetricsNamesTest, ThresholdAndTieringAddTheirFamilies) {
  MetricsRegistry registry;
  OffloadMetricsOptions options;
  options.store_threshold_enabled = true;
  options.tiering = true;
  auto metrics = RegisterOffloadMetrics(&registry, options);
  ASSERT_TRUE(metrics.ok()) << metrics.status().ToString();
  std::set<std::string> expected = Union({kConnectorNames, kCpuNames, kTieringNames});
  expected.insert(kStoresSkipped);
  EXPECT_EQ(Names(registry), expected);
  ASSERT_NE(metrics->stores_skipped, nullptr);
  ASSERT_NE(metrics->tiering_promotion_allocation_failures, nullptr);
}

TEST(OffloadMetricsNamesTest, ConstantsMatchTheHandWrittenList) {
  std::set<std::string> constants = {
      std::string(vllm_metric::kLoadBytes),
      std::string(vllm_metric::kLoadTime),
      std::string(vllm_metric::kLoadSize),
      std::string(vllm_metric::kStoreBytes),
      std::string(vllm_metric::kStoreTime),
      std::string(vllm_metric::kStoreSize),
      std::string(vllm_metric::kLookupSyncDelay),
      std::string(vllm_metric::kLookupAsyncDelay),
      std::string(vllm_metric::kAllocationFailure),
      std::string(vllm_metric::kCpuCacheUsagePerc),
      std::string(vllm_metric::kCpuCacheWriteUsagePerc),
      std::string(vllm_metric::kCpuCacheReadUsagePerc),
      std::string(vllm_metric::kCpuAllocationSize),
      std::string(vllm_metric::kStoresSkipped),
      std::string(vllm_metric::kTieringLookupSyncDelay),
      std::string(vllm_metric::kTieringLookupAsyncDelay),
      std::string(vllm_metric::kTieringReadBytes),
      std::string(vllm_metric::kTieringReadTime),
      std::string(vllm_metric::kTieringWriteBytes),
      std::string(vllm_metric::kTieringWriteTime),
      std::string(vllm_metric::kTieringPromotionJobFailures),
      std::string(vllm_metric::kTieringCascadeJobFailures),
      std::string(vllm_metric::kTieringBlockQueries),
      std::string(vllm_metric::kTieringBlockHits),
      std::string(vllm_metric::kTieringPrimaryWriteUsagePerc),
      std::string(vllm_metric::kTieringPrimaryReadUsagePerc),
      std::string(vllm_metric::kTieringActivePromotionJobs),
      std::string(vllm_metric::kTieringActiveCascadeJobs),
      std::string(vllm_metric::kTieringPromotionAllocationFailures),
  };
  std::set<std::string> expected = Union({kConnectorNames, kCpuNames, kTieringNames});
  expected.insert(kStoresSkipped);
  EXPECT_EQ(constants, expected);
}

TEST(OffloadMetricsNamesTest, RendersVllmsExposition) {
  MetricsRegistry registry;
  OffloadMetricsOptions options;
  options.store_threshold_enabled = true;
  options.tiering = true;
  auto metrics = RegisterOffloadMetrics(&registry, options);
  ASSERT_TRUE(metrics.ok()) << metrics.status().ToString();
  metrics->stores_skipped->Increment(3);
  metrics->cpu_cache_usage_perc->Set(0.25);
  metrics->cpu_allocation_size->Observe(16);
  auto fs = metrics->ForTier(SecondaryTierLabel(0, "fs"));
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  fs->block_queries->Increment(10);
  fs->block_hits->Increment(4);
  fs->active_promotion_jobs->Set(2);
  auto primary = metrics->ForTier(PrimaryTierLabel());
  ASSERT_TRUE(primary.ok());
  primary->block_queries->Increment();

  const std::string text = registry.RenderPrometheus();
  EXPECT_TRUE(Contains(text,
                       "# TYPE vllm:kv_offload_stores_skipped_total counter\n"
                       "vllm:kv_offload_stores_skipped_total 3.0\n"))
      << text;
  EXPECT_TRUE(Contains(text, "vllm:kv_offload_cpu_cache_usage_perc 0.25\n"));
  EXPECT_TRUE(Contains(text, "# TYPE vllm:kv_offload_allocation_failure_total counter\n"));
  EXPECT_TRUE(Contains(text, "# TYPE vllm:kv_offload_cpu_allocation_size histogram\n"));
  // Buckets 1, 4, ..., 262144 (powers of 4), as prometheus_client prints them.
  const std::vector<std::string> les = {"1.0",     "4.0",      "16.0",   "64.0",
                                        "256.0",   "1024.0",   "4096.0", "16384.0",
                                        "65536.0", "262144.0", "+Inf"};
  for (size_t i = 0; i < les.size(); ++i) {
    const std::string count = i >= 2 ? "1.0" : "0.0";
    EXPECT_TRUE(Contains(
        text, "vllm:kv_offload_cpu_allocation_size_bucket{le=\"" + les[i] + "\"} " + count + "\n"))
        << les[i] << "\n"
        << text;
  }
  EXPECT_TRUE(Contains(text, "vllm:kv_offload_load_size_bucket{le=\"1e+06\"} 0.0\n"));
  EXPECT_TRUE(Contains(text, "vllm:kv_offload_load_size_bucket{le=\"2e+08\"} 0.0\n"));
  EXPECT_TRUE(Contains(text,
                       "vllm:kv_offload_tiering_chunk_queries_total{tier=\"0:primary\"} 1.0\n"
                       "vllm:kv_offload_tiering_chunk_queries_total{tier=\"1:fs\"} 10.0\n"))
      << text;
  EXPECT_TRUE(Contains(text, "vllm:kv_offload_tiering_chunk_hits_total{tier=\"1:fs\"} 4.0\n"));
  EXPECT_TRUE(Contains(text, "vllm:kv_offload_tiering_active_promotion_jobs{tier=\"1:fs\"} 2.0\n"));
  EXPECT_TRUE(Contains(
      text,
      "vllm:kv_offload_tiering_lookup_sync_delay_seconds_bucket{tier=\"1:fs\",le=\"1e-05\"} "
      "0.0\n"));
  // promotion_allocation_failures has no tier label.
  EXPECT_TRUE(Contains(text, "vllm:kv_offload_tiering_promotion_allocation_failures_total 0.0\n"));
}

TEST(OffloadMetricsNamesTest, EngineLabelsComeFirst) {
  MetricsRegistry registry;
  OffloadMetricsOptions options;
  options.engine_labels = {{"model_name", "Qwen/Qwen3-8B"}, {"engine", "0"}};
  options.tiering = true;
  auto metrics = RegisterOffloadMetrics(&registry, options);
  ASSERT_TRUE(metrics.ok()) << metrics.status().ToString();
  metrics->allocation_failure->Increment();
  auto fs = metrics->ForTier("1:fs");
  ASSERT_TRUE(fs.ok());
  fs->write_bytes->Increment(4096);
  const std::string text = registry.RenderPrometheus();
  EXPECT_TRUE(Contains(
      text,
      "vllm:kv_offload_allocation_failure_total{model_name=\"Qwen/Qwen3-8B\",engine=\"0\"} 1.0\n"))
      << text;
  EXPECT_TRUE(Contains(text,
                       "vllm:kv_offload_tiering_write_bytes_total{model_name=\"Qwen/Qwen3-8B\","
                       "engine=\"0\",tier=\"1:fs\"} 4096.0\n"))
      << text;
}

TEST(OffloadMetricsNamesTest, RegisteringTwiceIsAnError) {
  MetricsRegistry registry;
  ASSERT_TRUE(RegisterOffloadMetrics(&registry, {}).ok());
  auto again = RegisterOffloadMetrics(&registry, {});
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kAlreadyExists);
}

TEST(OffloadMetricsNamesTest, BucketsAndTierLabels) {
  EXPECT_EQ(CpuAllocationSizeBuckets(),
            (std::vector<double>{1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144}));
  EXPECT_EQ(TransferSizeBuckets().front(), 1e6);
  EXPECT_EQ(TransferSizeBuckets().back(), 2e8);
  EXPECT_EQ(PrimaryTierLabel(), "0:primary");
  EXPECT_EQ(SecondaryTierLabel(0, "fs"), "1:fs");
  EXPECT_EQ(SecondaryTierLabel(2, "obj"), "3:obj");
}

}  // namespace
}  // namespace kvo
