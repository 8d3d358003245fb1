// The offload manager's Prometheus metrics under vLLM's names (vllm-compat.md B.12), registered in
// a MetricsRegistry (common/metrics.h) with vLLM's help texts and buckets; the manager and the
// tiers update the returned handles. Counters are named without "_total" here; the exposition adds
// it, as prometheus_client does ("vllm:kv_offload_stores_skipped_total").
//
// Not registered: vLLM's deprecated transfer_type-labelled duplicates (vllm:kv_offload_total_bytes,
// _total_time, _size) — kvo has no users of them to keep working.
//
// Registration is table driven (metrics.cc: one row per family, its handle as a member pointer).
// OffloadMetricsExporter feeds the families from OffloadManager::GetStats().
//
// Thread safety: as MetricsRegistry (handles are lock-free; TierMetrics lookups take a mutex).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/metrics.h"
#include "common/result.h"
#include "manager/offload_manager.h"
#include "transfer/transfer_engine.h"

namespace kvo {

// vLLM's metric names, exactly (B.12).
namespace vllm_metric {
// Connector (offloading/metrics.py).
inline constexpr std::string_view kLoadBytes = "vllm:kv_offload_load_bytes";
inline constexpr std::string_view kLoadTime = "vllm:kv_offload_load_time";
inline constexpr std::string_view kLoadSize = "vllm:kv_offload_load_size";
inline constexpr std::string_view kStoreBytes = "vllm:kv_offload_store_bytes";
inline constexpr std::string_view kStoreTime = "vllm:kv_offload_store_time";
inline constexpr std::string_view kStoreSize = "vllm:kv_offload_store_size";
inline constexpr std::string_view kLookupSyncDelay = "vllm:kv_offload_lookup_sync_delay_seconds";
inline constexpr std::string_view kLookupAsyncDelay = "vllm:kv_offload_lookup_async_delay_seconds";
inline constexpr std::string_view kAllocationFailure = "vllm:kv_offload_allocation_failure";
// CPU spec (cpu/common.py).
inline constexpr std::string_view kCpuCacheUsagePerc = "vllm:kv_offload_cpu_cache_usage_perc";
inline constexpr std::string_view kCpuCacheWriteUsagePerc =
    "vllm:kv_offload_cpu_cache_write_usage_perc";
inline constexpr std::string_view kCpuCacheReadUsagePerc =
    "vllm:kv_offload_cpu_cache_read_usage_perc";
inline constexpr std::string_view kCpuAllocationSize = "vllm:kv_offload_cpu_allocation_size";
inline constexpr std::string_view kStoresSkipped = "vllm:kv_offload_stores_skipped";
// Tiering (tiering/base.py), labelled `tier` except promotion_allocation_failures.
inline constexpr std::string_view kTieringLookupSyncDelay =
    "vllm:kv_offload_tiering_lookup_sync_delay_seconds";
inline constexpr std::string_view kTieringLookupAsyncDelay =
    "vllm:kv_offload_tiering_lookup_async_delay_seconds";
inline constexpr std::string_view kTieringReadBytes = "vllm:kv_offload_tiering_read_bytes";
inline constexpr std::string_view kTieringReadTime = "vllm:kv_offload_tiering_read_time";
inline constexpr std::string_view kTieringWriteBytes = "vllm:kv_offload_tiering_write_bytes";
inline constexpr std::string_view kTieringWriteTime = "vllm:kv_offload_tiering_write_time";
inline constexpr std::string_view kTieringPromotionJobFailures =
    "vllm:kv_offload_tiering_promotion_job_failures";
inline constexpr std::string_view kTieringCascadeJobFailures =
    "vllm:kv_offload_tiering_cascade_job_failures";
// vLLM #52812 renamed the two series (block_ -> chunk_); its constants kept the BLOCK_ names.
inline constexpr std::string_view kTieringBlockQueries = "vllm:kv_offload_tiering_chunk_queries";
inline constexpr std::string_view kTieringBlockHits = "vllm:kv_offload_tiering_chunk_hits";
inline constexpr std::string_view kTieringPrimaryWriteUsagePerc =
    "vllm:kv_offload_tiering_primary_write_usage_perc";
inline constexpr std::string_view kTieringPrimaryReadUsagePerc =
    "vllm:kv_offload_tiering_primary_read_usage_perc";
inline constexpr std::string_view kTieringActivePromotionJobs =
    "vllm:kv_offload_tiering_active_promotion_jobs";
inline constexpr std::string_view kTieringActiveCascadeJobs =
    "vllm:kv_offload_tiering_active_cascade_jobs";
inline constexpr std::string_view kTieringPromotionAllocationFailures =
    "vllm:kv_offload_tiering_promotion_allocation_failures";

inline constexpr std::string_view kTierLabel = "tier";
}  // namespace vllm_metric

// kvo's own families (not in vLLM).
namespace kvo_metric {
inline constexpr std::string_view kJournalBytes = "kvo:offload_journal_bytes";  // gauge
// Counter, labels medium ("CPU" | "STORAGE" | "GPU" | "other") and kind ("stored" | "evicted" |
// "failed" | "cleared" | "restart" | "removed"), in block events.
inline constexpr std::string_view kEvents = "kvo:offload_events";
inline constexpr std::string_view kEventsPublished = "kvo:offload_events_published";  // counter
inline constexpr std::string_view kEventErrors = "kvo:offload_event_errors";          // counter
}  // namespace kvo_metric

// vLLM's bucket bounds.
// cpu_allocation_size: 1, 4, 16, ..., 262144 (powers of 4).
std::vector<double> CpuAllocationSizeBuckets();
// load_size / store_size: 1e6 ... 2e8 bytes.
std::vector<double> TransferSizeBuckets();
// lookup_sync_delay_seconds (connector and tiering): 1e-5 ... 1 s.
std::vector<double> LookupSyncDelayBuckets();
// lookup_async_delay_seconds (connector and tiering): 1e-4 ... 10 s.
std::vector<double> LookupAsyncDelayBuckets();

// vLLM's tier label values: "0:primary" for the CPU tier, "<i+1>:<type>" for secondary tier i
// (0-based, configuration order), e.g. "1:fs".
std::string PrimaryTierLabel();
std::string SecondaryTierLabel(size_t secondary_index, std::string_view tier_type);

struct OffloadMetricsOptions {
  // Labels every family carries first, as vLLM's per-engine labels
  // (e.g. {{"model_name", "Qwen/Qwen3-8B"}, {"engine", "0"}}). Empty: none.
  std::vector<std::pair<std::string, std::string>> engine_labels;
  // vLLM registers stores_skipped only when store_threshold >= 2.
  bool store_threshold_enabled = false;
  // Register the tiering family (TieringOffloadingSpec).
  bool tiering = false;
};

// One tier's time series of the tiering family (label tier="<label>").
struct TierMetrics {
  Histogram* lookup_sync_delay_seconds = nullptr;
  Histogram* lookup_async_delay_seconds = nullptr;
  Counter* read_bytes = nullptr;
  Counter* read_time = nullptr;
  Counter* write_bytes = nullptr;
  Counter* write_time = nullptr;
  Counter* promotion_job_failures = nullptr;
  Counter* cascade_job_failures = nullptr;
  Counter* block_queries = nullptr;
  Counter* block_hits = nullptr;
  Gauge* primary_write_usage_perc = nullptr;
  Gauge* primary_read_usage_perc = nullptr;
  Gauge* active_promotion_jobs = nullptr;
  Gauge* active_cascade_jobs = nullptr;
};

// Handles into the registry; valid as long as the registry. A handle whose family is not
// registered under the options (stores_skipped, the tiering ones) is nullptr.
struct OffloadMetrics {
  // Connector.
  Counter* load_bytes = nullptr;
  Counter* load_time = nullptr;
  Histogram* load_size = nullptr;
  Counter* store_bytes = nullptr;
  Counter* store_time = nullptr;
  Histogram* store_size = nullptr;
  Histogram* lookup_sync_delay_seconds = nullptr;
  Histogram* lookup_async_delay_seconds = nullptr;
  Counter* allocation_failure = nullptr;
  // CPU tier.
  Gauge* cpu_cache_usage_perc = nullptr;
  Gauge* cpu_cache_write_usage_perc = nullptr;
  Gauge* cpu_cache_read_usage_perc = nullptr;
  Histogram* cpu_allocation_size = nullptr;
  Counter* stores_skipped = nullptr;  // only with store_threshold_enabled
  // Tiering.
  Counter* tiering_promotion_allocation_failures = nullptr;  // only with tiering

  // The tiering family's time series for one tier label (PrimaryTierLabel(),
  // SecondaryTierLabel(i, type)), created on first use. FailedPrecondition without `tiering`.
  Result<TierMetrics> ForTier(const std::string& tier_label) const;

  // Families, for ForTier (nullptr without `tiering`).
  struct TieringFamilies {
    HistogramFamily* lookup_sync_delay_seconds = nullptr;
    HistogramFamily* lookup_async_delay_seconds = nullptr;
    CounterFamily* read_bytes = nullptr;
    CounterFamily* read_time = nullptr;
    CounterFamily* write_bytes = nullptr;
    CounterFamily* write_time = nullptr;
    CounterFamily* promotion_job_failures = nullptr;
    CounterFamily* cascade_job_failures = nullptr;
    CounterFamily* block_queries = nullptr;
    CounterFamily* block_hits = nullptr;
    GaugeFamily* primary_write_usage_perc = nullptr;
    GaugeFamily* primary_read_usage_perc = nullptr;
    GaugeFamily* active_promotion_jobs = nullptr;
    GaugeFamily* active_cascade_jobs = nullptr;
  } tiering_families;
  std::vector<std::string> engine_label_values;
};

// Registers vLLM's offload metric families in `registry` and returns handles. Errors from the
// registry (a name already registered, an invalid engine label name) are returned unchanged.
Result<OffloadMetrics> RegisterOffloadMetrics(MetricsRegistry* registry,
                                              const OffloadMetricsOptions& options);

// Feeds a registry from OffloadManager::GetStats(): vLLM's families (RegisterOffloadMetrics under
// `options`) plus kvo's own (kvo_metric). Each Export advances counters by the difference from the
// previous Export's stats, sets gauges, adds the new histogram observations, and creates the
// tiering series of each tier label found in stats.tiers on first sight.
//
// Fed from ManagerStats: allocation_failure, the CPU usage gauges, cpu_allocation_size,
// stores_skipped, and the whole tiering family except read/write bytes and time (the transfer
// engine's to feed through metrics().ForTier). The connector's load/store families are fed by
// RecordTransfer with each finished GPU<->CPU transfer (vLLM's worker-side stats); its
// lookup-delay histograms stay registered but unfed.
//
// Thread-compatible: call Export from the thread that owns the manager (rendering may run
// anywhere: the registry is thread-safe).
class OffloadMetricsExporter {
 public:
  static Result<std::unique_ptr<OffloadMetricsExporter>> Create(
      MetricsRegistry* registry, const OffloadMetricsOptions& options);
  Status Export(const ManagerStats& stats);
  // One finished transfer between the engine's KV cache and the CPU tier: a store (GPU -> CPU)
  // adds to store_bytes / store_time / store_size, a load (CPU -> GPU) to the load families, as
  // vLLM's connector does per transfer. Failed transfers are not counted (vLLM counts successes).
  void RecordTransfer(const TransferResult& result);
  const OffloadMetrics& metrics() const { return metrics_; }

 private:
  OffloadMetricsExporter() = default;
  OffloadMetrics metrics_;
  Gauge* journal_bytes_ = nullptr;
  CounterFamily* events_ = nullptr;
  Counter* events_published_ = nullptr;
  Counter* event_errors_ = nullptr;
  std::map<std::string, TierMetrics> tiers_;  // by tier label
  ManagerStats last_;
};

}  // namespace kvo
