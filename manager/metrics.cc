// vLLM's offload metric families (B.12) with vLLM's help texts and buckets.
#include "manager/metrics.h"

namespace kvo {
namespace {

namespace m = vllm_metric;

// Which options register a family.
enum class When { kAlways, kStoreThreshold, kTiering };

// The registration table: one row per family, in vLLM's order (the exposition follows it). A row
// names its handle in OffloadMetrics (engine labels only), or its family in
// OffloadMetrics::TieringFamilies together with the handle in TierMetrics (engine labels + tier).
using BucketsFn = std::vector<double> (*)();
struct Row {
  MetricType type;
  std::string_view name;
  const char* help;
  When when = When::kAlways;
  BucketsFn buckets = nullptr;  // histograms
  // One of the three handles, or one family + tier handle pair, matching `type`.
  Counter* OffloadMetrics::*counter = nullptr;
  Gauge* OffloadMetrics::*gauge = nullptr;
  Histogram* OffloadMetrics::*histogram = nullptr;
  CounterFamily* OffloadMetrics::TieringFamilies::*counter_family = nullptr;
  Counter* TierMetrics::*tier_counter = nullptr;
  GaugeFamily* OffloadMetrics::TieringFamilies::*gauge_family = nullptr;
  Gauge* TierMetrics::*tier_gauge = nullptr;
  HistogramFamily* OffloadMetrics::TieringFamilies::*histogram_family = nullptr;
  Histogram* TierMetrics::*tier_histogram = nullptr;

  bool tiered() const {
    return counter_family != nullptr || gauge_family != nullptr || histogram_family != nullptr;
  }
};

using OM = OffloadMetrics;
using TF = OffloadMetrics::TieringFamilies;
using TM = TierMetrics;

Row C(std::string_view name, const char* help, Counter* OM::*h, When w = When::kAlways) {
  Row r{MetricType::kCounter, name, help, w};
  r.counter = h;
  return r;
}
Row G(std::string_view name, const char* help, Gauge* OM::*h) {
  Row r{MetricType::kGauge, name, help};
  r.gauge = h;
  return r;
}
Row H(std::string_view name, const char* help, BucketsFn b, Histogram* OM::*h) {
  Row r{MetricType::kHistogram, name, help, When::kAlways, b};
  r.histogram = h;
  return r;
}
Row TC(std::string_view name, const char* help, CounterFamily* TF::*f, Counter* TM::*h) {
  Row r{MetricType::kCounter, name, help, When::kTiering};
  r.counter_family = f;
  r.tier_counter = h;
  return r;
}
Row TG(std::string_view name, const char* help, GaugeFamily* TF::*f, Gauge* TM::*h) {
  Row r{MetricType::kGauge, name, help, When::kTiering};
  r.gauge_family = f;
  r.tier_gauge = h;
  return r;
}
Row TH(std::string_view name, const char* help, BucketsFn b, HistogramFamily* TF::*f,
       Histogram* TM::*h) {
  Row r{MetricType::kHistogram, name, help, When::kTiering, b};
  r.histogram_family = f;
  r.tier_histogram = h;
  return r;
}

const std::vector<Row>& Rows() {
  static const std::vector<Row> rows = {
      // Connector (offloading/metrics.py).
      C(m::kLoadBytes, "Total bytes loaded from offload storage to GPU.", &OM::load_bytes),
      C(m::kLoadTime, "Total load time from offload storage to GPU, in seconds.", &OM::load_time),
      H(m::kLoadSize, "Histogram of KV offload load operation size, in bytes.", TransferSizeBuckets,
        &OM::load_size),
      C(m::kStoreBytes, "Total bytes stored from GPU to offload storage.", &OM::store_bytes),
      C(m::kStoreTime, "Total store time from GPU to offload storage, in seconds.",
        &OM::store_time),
      H(m::kStoreSize, "Histogram of KV offload store operation size, in bytes.",
        TransferSizeBuckets, &OM::store_size),
      H(m::kLookupSyncDelay,
        "Histogram of the time spent in a single offload lookup call, in seconds.",
        LookupSyncDelayBuckets, &OM::lookup_sync_delay_seconds),
      H(m::kLookupAsyncDelay,
        "Histogram of time between a request's offload lookup first deferring and the following "
        "lookup resolving, or request finish, in seconds.",
        LookupAsyncDelayBuckets, &OM::lookup_async_delay_seconds),
      C(m::kAllocationFailure, "Number of KV offload store allocation attempts that failed.",
        &OM::allocation_failure),
      // CPU spec (cpu/common.py).
      G(m::kCpuCacheUsagePerc,
        "Fraction of the CPU offload cache pinned by in-flight transfers (write + read).",
        &OM::cpu_cache_usage_perc),
      G(m::kCpuCacheWriteUsagePerc,
        "Fraction of the CPU offload cache pinned by in-flight stores (GPU to CPU).",
        &OM::cpu_cache_write_usage_perc),
      G(m::kCpuCacheReadUsagePerc,
        "Fraction of the CPU offload cache pinned by in-flight loads (CPU to GPU).",
        &OM::cpu_cache_read_usage_perc),
      H(m::kCpuAllocationSize, "Histogram of the number of CPU blocks allocated per store.",
        CpuAllocationSizeBuckets, &OM::cpu_allocation_size),
      C(m::kStoresSkipped,
        "Number of blocks not stored because they were looked up fewer than store_threshold "
        "times.",
        &OM::stores_skipped, When::kStoreThreshold),
      // Tiering (tiering/base.py), labelled by tier.
      TH(m::kTieringLookupSyncDelay,
         "Histogram of the time spent in a single tier lookup call, labeled by tier, in seconds.",
         LookupSyncDelayBuckets, &TF::lookup_sync_delay_seconds, &TM::lookup_sync_delay_seconds),
      TH(m::kTieringLookupAsyncDelay,
         "Histogram of wall-clock time from a per-block tier lookup first returning retry until "
         "that same tier lookup resolves as a hit or miss, labeled by tier, in seconds.",
         LookupAsyncDelayBuckets, &TF::lookup_async_delay_seconds, &TM::lookup_async_delay_seconds),
      TC(m::kTieringReadBytes,
         "Total bytes read from secondary tiers into the primary tier, labeled by tier.",
         &TF::read_bytes, &TM::read_bytes),
      TC(m::kTieringReadTime,
         "Total time spent reading from secondary tiers into the primary tier, in seconds, "
         "labeled by tier.",
         &TF::read_time, &TM::read_time),
      TC(m::kTieringWriteBytes,
         "Total bytes written from the primary tier to secondary tiers, labeled by tier.",
         &TF::write_bytes, &TM::write_bytes),
      TC(m::kTieringWriteTime,
         "Total time spent writing from the primary tier to secondary tiers, in seconds, labeled "
         "by tier.",
         &TF::write_time, &TM::write_time),
      TC(m::kTieringPromotionJobFailures,
         "Number of failed secondary-tier promotion jobs, labeled by tier.",
         &TF::promotion_job_failures, &TM::promotion_job_failures),
      TC(m::kTieringCascadeJobFailures,
         "Number of failed secondary-tier cascade jobs, labeled by tier.",
         &TF::cascade_job_failures, &TM::cascade_job_failures),
      TC(m::kTieringBlockQueries, "Number of block lookup queries sent to a tier, labeled by tier.",
         &TF::block_queries, &TM::block_queries),
      TC(m::kTieringBlockHits, "Number of block lookup hits in a tier, labeled by tier.",
         &TF::block_hits, &TM::block_hits),
      TG(m::kTieringPrimaryWriteUsagePerc,
         "Current fraction of primary-tier space used by writes from secondary tiers, labeled by "
         "tier.",
         &TF::primary_write_usage_perc, &TM::primary_write_usage_perc),
      TG(m::kTieringPrimaryReadUsagePerc,
         "Current fraction of primary-tier space used by reads to secondary tiers, labeled by "
         "tier.",
         &TF::primary_read_usage_perc, &TM::primary_read_usage_perc),
      TG(m::kTieringActivePromotionJobs,
         "Number of active secondary-tier promotion jobs, labeled by tier.",
         &TF::active_promotion_jobs, &TM::active_promotion_jobs),
      TG(m::kTieringActiveCascadeJobs,
         "Number of active secondary-tier cascade jobs, labeled by tier.", &TF::active_cascade_jobs,
         &TM::active_cascade_jobs),
      C(m::kTieringPromotionAllocationFailures,
        "Number of promotion attempts that failed because the primary tier could not allocate "
        "space.",
        &OM::tiering_promotion_allocation_failures, When::kTiering),
  };
  return rows;
}

bool Enabled(When when, const OffloadMetricsOptions& options) {
  switch (when) {
    case When::kAlways:
      return true;
    case When::kStoreThreshold:
      return options.store_threshold_enabled;
    case When::kTiering:
      return options.tiering;
  }
  return false;
}

// Registers one row's family; stores its only child (engine labels) or the family (tiered).
Status RegisterRow(const Row& row, MetricsRegistry* registry,
                   const std::vector<std::string>& label_names,
                   const std::vector<std::string>& label_values, OffloadMetrics* out) {
  std::vector<std::string> names = label_names;
  if (row.tiered()) names.emplace_back(m::kTierLabel);
  std::string name(row.name);
  switch (row.type) {
    case MetricType::kCounter: {
      KVO_ASSIGN_OR_RETURN(CounterFamily * f,
                           registry->AddCounterFamily(std::move(name), row.help, std::move(names)));
      if (row.tiered()) {
        out->tiering_families.*row.counter_family = f;
        return Status::Ok();
      }
      KVO_ASSIGN_OR_RETURN(out->*row.counter, f->WithLabels(label_values));
      return Status::Ok();
    }
    case MetricType::kGauge: {
      KVO_ASSIGN_OR_RETURN(GaugeFamily * f,
                           registry->AddGaugeFamily(std::move(name), row.help, std::move(names)));
      if (row.tiered()) {
        out->tiering_families.*row.gauge_family = f;
        return Status::Ok();
      }
      KVO_ASSIGN_OR_RETURN(out->*row.gauge, f->WithLabels(label_values));
      return Status::Ok();
    }
    case MetricType::kHistogram: {
      KVO_ASSIGN_OR_RETURN(
          HistogramFamily * f,
          registry->AddHistogramFamily(std::move(name), row.help, row.buckets(), std::move(names)));
      if (row.tiered()) {
        out->tiering_families.*row.histogram_family = f;
        return Status::Ok();
      }
      KVO_ASSIGN_OR_RETURN(out->*row.histogram, f->WithLabels(label_values));
      return Status::Ok();
    }
  }
  return Status::Internal("metric " + std::string(row.name) + ": unknown type");
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
  if (tiering_families.read_bytes == nullptr) {
    return Status::FailedPrecondition("tier metrics for '" + tier_label +
                                      "': the tiering family was not registered "
                                      "(OffloadMetricsOptions::tiering is false)");
  }
  std::vector<std::string> values = engine_label_values;
  values.push_back(tier_label);
  TierMetrics t;
  for (const Row& row : Rows()) {
    if (row.counter_family != nullptr) {
      KVO_ASSIGN_OR_RETURN(t.*row.tier_counter,
                           (tiering_families.*row.counter_family)->WithLabels(values));
    } else if (row.gauge_family != nullptr) {
      KVO_ASSIGN_OR_RETURN(t.*row.tier_gauge,
                           (tiering_families.*row.gauge_family)->WithLabels(values));
    } else if (row.histogram_family != nullptr) {
      KVO_ASSIGN_OR_RETURN(t.*row.tier_histogram,
                           (tiering_families.*row.histogram_family)->WithLabels(values));
    }
  }
  return t;
}

Result<OffloadMetrics> RegisterOffloadMetrics(MetricsRegistry* registry,
                                              const OffloadMetricsOptions& options) {
  OffloadMetrics out;
  std::vector<std::string> label_names;
  for (const auto& [name, value] : options.engine_labels) {
    label_names.push_back(name);
    out.engine_label_values.push_back(value);
  }
  for (const Row& row : Rows()) {
    if (!Enabled(row.when, options)) continue;
    KVO_RETURN_IF_ERROR(RegisterRow(row, registry, label_names, out.engine_label_values, &out));
  }
  return out;
}

// ---- OffloadMetricsExporter ----

namespace {

// The counter's increase since `last` (a cumulative source never goes down; if it did, e.g. a new
// manager behind the same exporter, nothing is added).
void Advance(Counter* c, double now, double last) {
  if (c != nullptr && now > last) c->Increment(now - last);
}

void AdvanceHistogram(Histogram* h, const std::vector<uint64_t>& now, double now_sum,
                      const std::vector<uint64_t>& last, double last_sum) {
  if (h == nullptr || now.empty()) return;
  std::vector<uint64_t> delta(now.size(), 0);
  bool any = false;
  for (size_t i = 0; i < now.size(); ++i) {
    const uint64_t before = i < last.size() ? last[i] : 0;
    delta[i] = now[i] > before ? now[i] - before : 0;
    any |= delta[i] != 0;
  }
  if (any) h->AddBucketed(delta, now_sum - last_sum).IgnoreError();
}

}  // namespace

Result<std::unique_ptr<OffloadMetricsExporter>> OffloadMetricsExporter::Create(
    MetricsRegistry* registry, const OffloadMetricsOptions& options) {
  std::unique_ptr<OffloadMetricsExporter> e(new OffloadMetricsExporter());
  KVO_ASSIGN_OR_RETURN(e->metrics_, RegisterOffloadMetrics(registry, options));
  std::vector<std::string> names;
  for (const auto& [name, value] : options.engine_labels) names.push_back(name);
  const std::vector<std::string>& values = e->metrics_.engine_label_values;
  KVO_ASSIGN_OR_RETURN(
      GaugeFamily * journal,
      registry->AddGaugeFamily(std::string(kvo_metric::kJournalBytes),
                               "Bytes in the offload manager's event journal.", names));
  KVO_ASSIGN_OR_RETURN(e->journal_bytes_, journal->WithLabels(values));
  std::vector<std::string> event_labels = names;
  event_labels.emplace_back("medium");
  event_labels.emplace_back("kind");
  KVO_ASSIGN_OR_RETURN(
      e->events_,
      registry->AddCounterFamily(std::string(kvo_metric::kEvents),
                                 "Block events emitted by the offload manager, by medium and kind "
                                 "(stored, or the removal reason).",
                                 event_labels));
  KVO_ASSIGN_OR_RETURN(
      CounterFamily * published,
      registry->AddCounterFamily(std::string(kvo_metric::kEventsPublished),
                                 "KV events handed to the journal or publisher.", names));
  KVO_ASSIGN_OR_RETURN(e->events_published_, published->WithLabels(values));
  KVO_ASSIGN_OR_RETURN(
      CounterFamily * errors,
      registry->AddCounterFamily(std::string(kvo_metric::kEventErrors),
                                 "Event batches the journal or publisher refused.", names));
  KVO_ASSIGN_OR_RETURN(e->event_errors_, errors->WithLabels(values));
  return e;
}

void OffloadMetricsExporter::RecordTransfer(const TransferResult& r) {
  if (!r.success) return;
  const bool store = r.direction == TransferDirection::kGpuToCpu;
  OffloadMetrics& m = metrics_;
  (store ? m.store_bytes : m.load_bytes)->Increment(static_cast<double>(r.bytes));
  (store ? m.store_time : m.load_time)->Increment(r.seconds);
  (store ? m.store_size : m.load_size)->Observe(static_cast<double>(r.bytes));
}

Status OffloadMetricsExporter::Export(const ManagerStats& s) {
  const ManagerStats& l = last_;
  OffloadMetrics& m = metrics_;
  Advance(m.allocation_failure, double(s.store_failures), double(l.store_failures));
  m.cpu_cache_usage_perc->Set(s.usage);
  m.cpu_cache_write_usage_perc->Set(s.write_usage);
  m.cpu_cache_read_usage_perc->Set(s.read_usage);
  AdvanceHistogram(
      m.cpu_allocation_size,
      std::vector<uint64_t>(std::begin(s.allocation_buckets), std::end(s.allocation_buckets)),
      double(s.allocation_sum),
      std::vector<uint64_t>(std::begin(l.allocation_buckets), std::end(l.allocation_buckets)),
      double(l.allocation_sum));
  Advance(m.stores_skipped, double(s.stores_skipped), double(l.stores_skipped));
  Advance(m.tiering_promotion_allocation_failures, double(s.promotion_allocation_failures),
          double(l.promotion_allocation_failures));

  for (size_t t = 0; t < s.tiers.size(); ++t) {
    const TierStats& ts = s.tiers[t];
    auto it = tiers_.find(ts.label);
    if (it == tiers_.end()) {
      KVO_ASSIGN_OR_RETURN(TierMetrics tm, m.ForTier(ts.label));
      it = tiers_.emplace(ts.label, tm).first;
    }
    const TierMetrics& tm = it->second;
    static const TierStats kZero;
    const TierStats& lt = t < l.tiers.size() && l.tiers[t].label == ts.label ? l.tiers[t] : kZero;
    Advance(tm.block_queries, double(ts.block_queries), double(lt.block_queries));
    Advance(tm.block_hits, double(ts.block_hits), double(lt.block_hits));
    Advance(tm.promotion_job_failures, double(ts.promotion_job_failures),
            double(lt.promotion_job_failures));
    Advance(tm.cascade_job_failures, double(ts.cascade_job_failures),
            double(lt.cascade_job_failures));
    tm.active_promotion_jobs->Set(double(ts.active_promotion_jobs));
    tm.active_cascade_jobs->Set(double(ts.active_cascade_jobs));
    tm.primary_write_usage_perc->Set(ts.primary_write_usage);
    tm.primary_read_usage_perc->Set(ts.primary_read_usage);
    AdvanceHistogram(tm.lookup_sync_delay_seconds, ts.lookup_sync_delay.counts,
                     ts.lookup_sync_delay.sum, lt.lookup_sync_delay.counts,
                     lt.lookup_sync_delay.sum);
    AdvanceHistogram(tm.lookup_async_delay_seconds, ts.lookup_async_delay.counts,
                     ts.lookup_async_delay.sum, lt.lookup_async_delay.counts,
                     lt.lookup_async_delay.sum);
  }

  journal_bytes_->Set(double(s.journal_bytes));
  Advance(events_published_, double(s.events_published), double(l.events_published));
  Advance(event_errors_, double(s.event_errors), double(l.event_errors));
  std::vector<std::string> values = metrics_.engine_label_values;
  values.resize(values.size() + 2);
  for (size_t md = 0; md < EventCounts::kNumMedia; ++md) {
    for (size_t k = 0; k < EventCounts::kNumKinds; ++k) {
      const uint64_t now = s.events_taken.blocks[md][k];
      const uint64_t before = l.events_taken.blocks[md][k];
      if (now == 0 || now <= before) continue;  // a series appears with its first event
      values[values.size() - 2] = EventCounts::kMedia[md];
      values[values.size() - 1] = EventCounts::kKinds[k];
      KVO_ASSIGN_OR_RETURN(Counter * c, events_->WithLabels(values));
      c->Increment(double(now - before));
    }
  }
  last_ = s;
  return Status::Ok();
}

}  // namespace kvo
