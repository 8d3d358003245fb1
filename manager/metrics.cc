// vLLM's offload metric families (B.12) with vLLM's help texts and buckets.
#include "manager/metrics.h"

namespace kvo {
namespace {

namespace m = vllm_metric;

class Registrar {
 public:
  Registrar(MetricsRegistry* registry, const OffloadMetricsOptions& options) : registry_(registry) {
    for (const auto& [name, value] : options.engine_labels) {
      label_names_.push_back(name);
      label_values_.push_back(value);
    }
  }

  const std::vector<std::string>& label_values() const { return label_values_; }

  Result<Counter*> Counter1(std::string_view name, std::string help) {
    KVO_ASSIGN_OR_RETURN(CounterFamily * f, registry_->AddCounterFamily(
                                                std::string(name), std::move(help), label_names_));
    return f->WithLabels(label_values_);
  }
  Result<Gauge*> Gauge1(std::string_view name, std::string help) {
    KVO_ASSIGN_OR_RETURN(GaugeFamily * f, registry_->AddGaugeFamily(std::string(name),
                                                                    std::move(help), label_names_));
    return f->WithLabels(label_values_);
  }
  Result<Histogram*> Histogram1(std::string_view name, std::string help,
                                std::vector<double> buckets) {
    KVO_ASSIGN_OR_RETURN(HistogramFamily * f,
                         registry_->AddHistogramFamily(std::string(name), std::move(help),
                                                       std::move(buckets), label_names_));
    return f->WithLabels(label_values_);
  }

  // Families labelled by the engine labels plus `tier`.
  Result<CounterFamily*> TierCounter(std::string_view name, std::string help) {
    return registry_->AddCounterFamily(std::string(name), std::move(help), TierLabels());
  }
  Result<GaugeFamily*> TierGauge(std::string_view name, std::string help) {
    return registry_->AddGaugeFamily(std::string(name), std::move(help), TierLabels());
  }
  Result<HistogramFamily*> TierHistogram(std::string_view name, std::string help,
                                         std::vector<double> buckets) {
    return registry_->AddHistogramFamily(std::string(name), std::move(help), std::move(buckets),
                                         TierLabels());
  }

 private:
  std::vector<std::string> TierLabels() const {
    std::vector<std::string> names = label_names_;
    names.emplace_back(m::kTierLabel);
    return names;
  }

  MetricsRegistry* registry_;
  std::vector<std::string> label_names_;
  std::vector<std::string> label_values_;
};

template <class T>
Result<T*> Child(MetricFamily<T>* family, std::vector<std::string> values,
                 const std::string& tier) {
  values.push_back(tier);
  return family->WithLabels(values);
}

}  // namespace

std::vector<double> CpuAllocationSizeBuckets() {
  return {1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144};
}

std::vector<double> TransferSizeBuckets() {
  return {1e6, 5e6, 10e6, 20e6, 40e6, 60e6, 80e6, 100e6, 150e6, 200e6};
}

std::vector<double> LookupSyncDelayBuckets() {
  return {0.00001, 0.00005, 0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1};
}

std::vector<double> LookupAsyncDelayBuckets() {
  return {0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10};
}

std::string PrimaryTierLabel() { return "0:primary"; }

std::string SecondaryTierLabel(size_t secondary_index, std::string_view tier_type) {
  return std::to_string(secondary_index + 1) + ":" + std::string(tier_type);
}

Result<TierMetrics> OffloadMetrics::ForTier(const std::string& tier_label) const {
  const TieringFamilies& f = tiering_families;
  if (f.read_bytes == nullptr) {
    return Status::FailedPrecondition("tier metrics for '" + tier_label +
                                      "': the tiering family was not registered "
                                      "(OffloadMetricsOptions::tiering is false)");
  }
  const std::vector<std::string>& v = engine_label_values;
  TierMetrics t;
  KVO_ASSIGN_OR_RETURN(t.lookup_sync_delay_seconds,
                       Child(f.lookup_sync_delay_seconds, v, tier_label));
  KVO_ASSIGN_OR_RETURN(t.lookup_async_delay_seconds,
                       Child(f.lookup_async_delay_seconds, v, tier_label));
  KVO_ASSIGN_OR_RETURN(t.read_bytes, Child(f.read_bytes, v, tier_label));
  KVO_ASSIGN_OR_RETURN(t.read_time, Child(f.read_time, v, tier_label));
  KVO_ASSIGN_OR_RETURN(t.write_bytes, Child(f.write_bytes, v, tier_label));
  KVO_ASSIGN_OR_RETURN(t.write_time, Child(f.write_time, v, tier_label));
  KVO_ASSIGN_OR_RETURN(t.promotion_job_failures, Child(f.promotion_job_failures, v, tier_label));
  KVO_ASSIGN_OR_RETURN(t.cascade_job_failures, Child(f.cascade_job_failures, v, tier_label));
  KVO_ASSIGN_OR_RETURN(t.block_queries, Child(f.block_queries, v, tier_label));
  KVO_ASSIGN_OR_RETURN(t.block_hits, Child(f.block_hits, v, tier_label));
  KVO_ASSIGN_OR_RETURN(t.primary_write_usage_perc,
                       Child(f.primary_write_usage_perc, v, tier_label));
  KVO_ASSIGN_OR_RETURN(t.primary_read_usage_perc, Child(f.primary_read_usage_perc, v, tier_label));
  KVO_ASSIGN_OR_RETURN(t.active_promotion_jobs, Child(f.active_promotion_jobs, v, tier_label));
  KVO_ASSIGN_OR_RETURN(t.active_cascade_jobs, Child(f.active_cascade_jobs, v, tier_label));
  return t;
}

Result<OffloadMetrics> RegisterOffloadMetrics(MetricsRegistry* registry,
                                              const OffloadMetricsOptions& options) {
  Registrar r(registry, options);
  OffloadMetrics out;
  out.engine_label_values = r.label_values();

  // Connector.
  KVO_ASSIGN_OR_RETURN(
      out.load_bytes, r.Counter1(m::kLoadBytes, "Total bytes loaded from offload storage to GPU."));
  KVO_ASSIGN_OR_RETURN(
      out.load_time,
      r.Counter1(m::kLoadTime, "Total load time from offload storage to GPU, in seconds."));
  KVO_ASSIGN_OR_RETURN(
      out.load_size,
      r.Histogram1(m::kLoadSize, "Histogram of KV offload load operation size, in bytes.",
                   TransferSizeBuckets()));
  KVO_ASSIGN_OR_RETURN(
      out.store_bytes,
      r.Counter1(m::kStoreBytes, "Total bytes stored from GPU to offload storage."));
  KVO_ASSIGN_OR_RETURN(
      out.store_time,
      r.Counter1(m::kStoreTime, "Total store time from GPU to offload storage, in seconds."));
  KVO_ASSIGN_OR_RETURN(
      out.store_size,
      r.Histogram1(m::kStoreSize, "Histogram of KV offload store operation size, in bytes.",
                   TransferSizeBuckets()));
  KVO_ASSIGN_OR_RETURN(
      out.lookup_sync_delay_seconds,
      r.Histogram1(m::kLookupSyncDelay,
                   "Histogram of the time spent in a single offload lookup call, in seconds.",
                   LookupSyncDelayBuckets()));
  KVO_ASSIGN_OR_RETURN(
      out.lookup_async_delay_seconds,
      r.Histogram1(m::kLookupAsyncDelay,
                   "Histogram of time between a request's offload lookup first deferring and the "
                   "following lookup resolving, or request finish, in seconds.",
                   LookupAsyncDelayBuckets()));
  KVO_ASSIGN_OR_RETURN(out.allocation_failure,
                       r.Counter1(m::kAllocationFailure,
                                  "Number of KV offload store allocation attempts that failed."));

  // CPU tier.
  KVO_ASSIGN_OR_RETURN(
      out.cpu_cache_usage_perc,
      r.Gauge1(m::kCpuCacheUsagePerc,
               "Fraction of the CPU offload cache pinned by in-flight transfers (write + read)."));
  KVO_ASSIGN_OR_RETURN(
      out.cpu_cache_write_usage_perc,
      r.Gauge1(m::kCpuCacheWriteUsagePerc,
               "Fraction of the CPU offload cache pinned by in-flight stores (GPU to CPU)."));
  KVO_ASSIGN_OR_RETURN(
      out.cpu_cache_read_usage_perc,
      r.Gauge1(m::kCpuCacheReadUsagePerc,
               "Fraction of the CPU offload cache pinned by in-flight loads (CPU to GPU)."));
  KVO_ASSIGN_OR_RETURN(out.cpu_allocation_size,
                       r.Histogram1(m::kCpuAllocationSize,
                                    "Histogram of the number of CPU blocks allocated per store.",
                                    CpuAllocationSizeBuckets()));
  if (options.store_threshold_enabled) {
    KVO_ASSIGN_OR_RETURN(
        out.stores_skipped,
        r.Counter1(m::kStoresSkipped,
                   "Number of blocks not stored because they were looked up fewer than "
                   "store_threshold times."));
  }

  // Tiering.
  if (options.tiering) {
    OffloadMetrics::TieringFamilies& f = out.tiering_families;
    KVO_ASSIGN_OR_RETURN(
        f.lookup_sync_delay_seconds,
        r.TierHistogram(m::kTieringLookupSyncDelay,
                        "Histogram of the time spent in a single tier lookup call, labeled by "
                        "tier, in seconds.",
                        LookupSyncDelayBuckets()));
    KVO_ASSIGN_OR_RETURN(
        f.lookup_async_delay_seconds,
        r.TierHistogram(m::kTieringLookupAsyncDelay,
                        "Histogram of wall-clock time from a per-block tier lookup first "
                        "returning retry until that same tier lookup resolves as a hit or miss, "
                        "labeled by tier, in seconds.",
                        LookupAsyncDelayBuckets()));
    KVO_ASSIGN_OR_RETURN(
        f.read_bytes,
        r.TierCounter(m::kTieringReadBytes,
                      "Total bytes read from secondary tiers into the primary tier, labeled by "
                      "tier."));
    KVO_ASSIGN_OR_RETURN(
        f.read_time,
        r.TierCounter(m::kTieringReadTime,
                      "Total time spent reading from secondary tiers into the primary tier, in "
                      "seconds, labeled by tier."));
    KVO_ASSIGN_OR_RETURN(
        f.write_bytes,
        r.TierCounter(m::kTieringWriteBytes,
                      "Total bytes written from the primary tier to secondary tiers, labeled by "
                      "tier."));
    KVO_ASSIGN_OR_RETURN(
        f.write_time,
        r.TierCounter(m::kTieringWriteTime,
                      "Total time spent writing from the primary tier to secondary tiers, in "
                      "seconds, labeled by tier."));
    KVO_ASSIGN_OR_RETURN(
        f.promotion_job_failures,
        r.TierCounter(m::kTieringPromotionJobFailures,
                      "Number of failed secondary-tier promotion jobs, labeled by tier."));
    KVO_ASSIGN_OR_RETURN(
        f.cascade_job_failures,
        r.TierCounter(m::kTieringCascadeJobFailures,
                      "Number of failed secondary-tier cascade jobs, labeled by tier."));
    KVO_ASSIGN_OR_RETURN(
        f.block_queries,
        r.TierCounter(m::kTieringBlockQueries,
                      "Number of block lookup queries sent to a tier, labeled by tier."));
    KVO_ASSIGN_OR_RETURN(f.block_hits,
                         r.TierCounter(m::kTieringBlockHits,
                                       "Number of block lookup hits in a tier, labeled by tier."));
    KVO_ASSIGN_OR_RETURN(
        f.primary_write_usage_perc,
        r.TierGauge(m::kTieringPrimaryWriteUsagePerc,
                    "Current fraction of primary-tier space used by writes from secondary tiers, "
                    "labeled by tier."));
    KVO_ASSIGN_OR_RETURN(
        f.primary_read_usage_perc,
        r.TierGauge(m::kTieringPrimaryReadUsagePerc,
                    "Current fraction of primary-tier space used by reads to secondary tiers, "
                    "labeled by tier."));
    KVO_ASSIGN_OR_RETURN(
        f.active_promotion_jobs,
        r.TierGauge(m::kTieringActivePromotionJobs,
                    "Number of active secondary-tier promotion jobs, labeled by tier."));
    KVO_ASSIGN_OR_RETURN(
        f.active_cascade_jobs,
        r.TierGauge(m::kTieringActiveCascadeJobs,
                    "Number of active secondary-tier cascade jobs, labeled by tier."));
    KVO_ASSIGN_OR_RETURN(
        out.tiering_promotion_allocation_failures,
        r.Counter1(m::kTieringPromotionAllocationFailures,
                   "Number of promotion attempts that failed because the primary tier could not "
                   "allocate space."));
  }
  return out;
}

}  // namespace kvo
