// Metrics: counters, gauges and histograms with labels, kept in a MetricsRegistry and rendered in
// the Prometheus text exposition format 0.0.4 (what prometheus_client writes for vLLM's /metrics).
//
// Model: a registry holds metric families (name, help, type, label names); a family holds one
// child time series per tuple of label values. Children are created on first use and live as long
// as the registry, so a caller looks a child up once and keeps the pointer on its hot path.
//
// Thread safety: everything is thread-safe. Registration and child lookup take a mutex; updates to
// a child are lock-free atomics; RenderPrometheus() takes the mutexes, never an update's path.
//
// Rendering, as prometheus_client does it: families in registration order, children sorted by
// label values; a counter "x" renders as "x_total" (a name given as "x_total" is the same family);
// histograms render cumulative "_bucket{le=...}" lines ending in le="+Inf", then "_sum" and
// "_count" (always equal to the +Inf bucket); numbers formatted as Python's floatToGoString
// ("1.0", "262144.0", "1e+06", "+Inf"). No "_created" series.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/mutex.h"
#include "common/result.h"
#include "common/thread_annotations.h"

namespace kvo {

enum class MetricType { kCounter, kGauge, kHistogram };
std::string_view MetricTypeName(MetricType type);  // "counter" | "gauge" | "histogram"

// A monotonically increasing value.
class Counter {
 public:
  // Adds v. A negative or NaN v is ignored (a counter never goes down).
  void Increment(double v = 1.0);
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// A value that goes up and down.
class Gauge {
 public:
  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Increment(double v = 1.0) { value_.fetch_add(v, std::memory_order_relaxed); }
  void Decrement(double v = 1.0) { value_.fetch_sub(v, std::memory_order_relaxed); }
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// Observations counted into fixed buckets (upper bounds, strictly increasing, +Inf implicit).
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);

  void Observe(double v);
  // Adds pre-bucketed observations: counts[i] to bucket i (non-cumulative: one per upper bound,
  // then +Inf) and `sum` to the sum. InvalidArgument (nothing added) when counts has the wrong
  // size.
  Status AddBucketed(const std::vector<uint64_t>& counts, double sum);

  // A consistent-enough view: count equals the sum of the buckets (the +Inf bucket).
  struct Snapshot {
    std::vector<uint64_t> cumulative;  // one per upper bound, then +Inf
    double sum = 0.0;
    uint64_t count = 0;
  };
  Snapshot Take() const;
  const std::vector<double>& upper_bounds() const { return upper_bounds_; }

 private:
  const std::vector<double> upper_bounds_;
  // Non-cumulative: counts_[i] counts observations in (bound[i-1], bound[i]]; the last is +Inf.
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;
  std::atomic<double> sum_{0.0};
};

// One family: a name, its help text, its label names and one child per tuple of label values.
template <class T>
class MetricFamily {
 public:
  const std::string& name() const { return name_; }
  const std::vector<std::string>& label_names() const { return label_names_; }

  // The child for these label values, created on first use; the pointer stays valid for the
  // registry's life, or until Remove of these values. InvalidArgument when the number of values
  // differs from the label names.
  Result<T*> WithLabels(const std::vector<std::string>& values);

  // Drops the child for these values (it is no longer rendered; a later WithLabels starts a fresh
  // one at zero). For series whose subject is gone (an unregistered stream): without it they stay,
  // frozen, for the registry's life. The caller must hold no pointer to that child any more.
  void Remove(const std::vector<std::string>& values);

 private:
  friend class MetricsRegistry;
  MetricFamily(std::string name, std::vector<std::string> label_names, std::vector<double> buckets)
      : name_(std::move(name)),
        label_names_(std::move(label_names)),
        buckets_(std::move(buckets)) {}

  const std::string name_;
  const std::vector<std::string> label_names_;
  const std::vector<double> buckets_;  // histograms only
  mutable Mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<T>> children_ GUARDED_BY(mu_);
};

using CounterFamily = MetricFamily<Counter>;
using GaugeFamily = MetricFamily<Gauge>;
using HistogramFamily = MetricFamily<Histogram>;

class MetricsRegistry {
 public:
  MetricsRegistry();
  ~MetricsRegistry();
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // Registers a family. InvalidArgument for a name outside [a-zA-Z_:][a-zA-Z0-9_:]*, a label name
  // outside [a-zA-Z_][a-zA-Z0-9_]* (or starting with "__", or a repeated one, or "le" on a
  // histogram), or histogram buckets that are empty, not finite or not strictly increasing.
  // AlreadyExists when any of the family's rendered names (a counter's "_total", a histogram's
  // "_bucket"/"_sum"/"_count") is already taken.
  Result<CounterFamily*> AddCounterFamily(std::string name, std::string help,
                                          std::vector<std::string> label_names = {});
  Result<GaugeFamily*> AddGaugeFamily(std::string name, std::string help,
                                      std::vector<std::string> label_names = {});
  Result<HistogramFamily*> AddHistogramFamily(std::string name, std::string help,
                                              std::vector<double> buckets,
                                              std::vector<std::string> label_names = {});

  // Label-less shorthands: register the family and return its only child.
  Result<Counter*> AddCounter(std::string name, std::string help);
  Result<Gauge*> AddGauge(std::string name, std::string help);
  Result<Histogram*> AddHistogram(std::string name, std::string help, std::vector<double> buckets);

  // The text exposition format 0.0.4 (Content-Type: text/plain; version=0.0.4; charset=utf-8).
  std::string RenderPrometheus() const;

  // Names (as registered, counters without "_total") in registration order.
  std::vector<std::string> FamilyNames() const;

 private:
  struct Entry;
  Status Reserve(const std::string& name, MetricType type) EXCLUSIVE_LOCKS_REQUIRED(mu_);
  template <class T>
  Result<MetricFamily<T>*> Add(MetricType type, std::string name, std::string help,
                               std::vector<std::string> label_names, std::vector<double> buckets);

  mutable Mutex mu_;
  std::vector<std::unique_ptr<Entry>> entries_ GUARDED_BY(mu_);
  std::set<std::string, std::less<>> taken_ GUARDED_BY(mu_);  // every sample name in use
};

// Validation and formatting helpers (exposed for tests and for other exporters).
bool IsValidMetricName(std::string_view name);  // [a-zA-Z_:][a-zA-Z0-9_:]*
bool IsValidLabelName(std::string_view name);   // [a-zA-Z_][a-zA-Z0-9_]*
// Label value escaping: backslash, double quote and newline.
std::string EscapeLabelValue(std::string_view value);
// HELP text escaping: backslash and newline.
std::string EscapeHelp(std::string_view help);
// prometheus_client's floatToGoString: "3.0", "0.25", "262144.0", "1e+06", "1e-05", "+Inf", "NaN".
std::string FormatMetricValue(double v);

}  // namespace kvo
