// Prometheus text exposition (format 0.0.4); see metrics.h for the rendering rules.
#include "common/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <utility>

namespace kvo {
namespace {

constexpr std::string_view kTotalSuffix = "_total";

bool IsAlpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// Python's repr() of a finite, non-zero double without its sign: the shortest round-trip digits,
// fixed notation for decimal exponents in [-4, 16), scientific otherwise ("1e+16", "1.5e-07").
std::string PythonRepr(double magnitude) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), magnitude, std::chars_format::scientific);
  std::string_view s(buf, static_cast<size_t>(res.ptr - buf));
  const size_t e = s.find('e');
  std::string digits;
  for (char c : s.substr(0, e)) {
    if (c != '.') digits.push_back(c);
  }
  int exp = 0;
  std::string_view exp_text = s.substr(e + 1);
  if (!exp_text.empty() && exp_text.front() == '+') exp_text.remove_prefix(1);
  std::from_chars(exp_text.data(), exp_text.data() + exp_text.size(), exp);

  std::string out;
  if (exp >= -4 && exp < 16) {
    if (exp >= 0) {
      const size_t int_len = static_cast<size_t>(exp) + 1;
      if (digits.size() <= int_len) {
        out = digits + std::string(int_len - digits.size(), '0') + ".0";
      } else {
        out = digits.substr(0, int_len) + "." + digits.substr(int_len);
      }
    } else {
      out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    out += exp < 0 ? "e-" : "e+";
    const int abs_exp = std::abs(exp);
    if (abs_exp < 10) out += '0';
    out += std::to_string(abs_exp);
  }
  return out;
}

std::string RenderLabels(const std::vector<std::string>& names,
                         const std::vector<std::string>& values, std::string_view extra_name = {},
                         std::string_view extra_value = {}) {
  if (names.empty() && extra_name.empty()) return "";
  std::string out = "{";
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += ',';
    out += names[i];
    out += "=\"";
    out += EscapeLabelValue(values[i]);
    out += '"';
  }
  if (!extra_name.empty()) {
    if (!names.empty()) out += ',';
    out += extra_name;
    out += "=\"";
    out += extra_value;
    out += '"';
  }
  out += '}';
  return out;
}

void AppendSample(std::string* out, std::string_view name, const std::string& labels, double v) {
  *out += name;
  *out += labels;
  *out += ' ';
  *out += FormatMetricValue(v);
  *out += '\n';
}

Status ValidateLabelNames(const std::string& metric, const std::vector<std::string>& names,
                          MetricType type) {
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& n = names[i];
    if (!IsValidLabelName(n) || n.starts_with("__")) {
      return Status::InvalidArgument("metric '" + metric + "': label name '" + n +
                                     "' is invalid (allowed: [a-zA-Z_][a-zA-Z0-9_]*, not "
                                     "starting with \"__\")");
    }
    if (type == MetricType::kHistogram && n == "le") {
      return Status::InvalidArgument("metric '" + metric +
                                     "': label name 'le' is reserved for histogram buckets");
    }
    for (size_t j = 0; j < i; ++j) {
      if (names[j] == n) {
        return Status::InvalidArgument("metric '" + metric + "': label name '" + n +
                                       "' is repeated");
      }
    }
  }
  return Status::Ok();
}

}  // namespace

std::string_view MetricTypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

bool IsValidMetricName(std::string_view name) {
  if (name.empty()) return false;
  if (!(IsAlpha(name[0]) || name[0] == '_' || name[0] == ':')) return false;
  return std::all_of(name.begin() + 1, name.end(),
                     [](char c) { return IsAlpha(c) || IsDigit(c) || c == '_' || c == ':'; });
}

bool IsValidLabelName(std::string_view name) {
  if (name.empty()) return false;
  if (!(IsAlpha(name[0]) || name[0] == '_')) return false;
  return std::all_of(name.begin() + 1, name.end(),
                     [](char c) { return IsAlpha(c) || IsDigit(c) || c == '_'; });
}

std::string EscapeLabelValue(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string EscapeHelp(std::string_view help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string FormatMetricValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == 0.0) return std::signbit(v) ? "-0.0" : "0.0";
  std::string s = PythonRepr(std::fabs(v));
  if (v < 0) return "-" + s;
  // floatToGoString: Go switches to exponents sooner than Python (from 1e6 on, positives only).
  const size_t dot = s.find('.');
  if (dot != std::string::npos && dot > 6) {
    std::string mantissa = s.substr(0, 1) + "." + s.substr(1, dot - 1) + s.substr(dot + 1);
    while (!mantissa.empty() && (mantissa.back() == '0' || mantissa.back() == '.')) {
      mantissa.pop_back();
    }
    return mantissa + "e+0" + std::to_string(dot - 1);
  }
  return s;
}

// ---- Counter / Histogram ---------------------------------------------------------------------

void Counter::Increment(double v) {
  if (!(v >= 0.0)) return;  // negative or NaN
  value_.fetch_add(v, std::memory_order_relaxed);
}

Histogram::Histogram(std::vector<double> upper_bounds)
    : upper_bounds_(std::move(upper_bounds)),
      counts_(new std::atomic<uint64_t>[upper_bounds_.size() + 1]) {
  for (size_t i = 0; i <= upper_bounds_.size(); ++i) counts_[i].store(0);
}

void Histogram::Observe(double v) {
  // First bucket whose upper bound is >= v (le is inclusive); NaN lands in +Inf.
  const size_t i =
      std::isnan(v)
          ? upper_bounds_.size()
          : static_cast<size_t>(std::lower_bound(upper_bounds_.begin(), upper_bounds_.end(), v) -
                                upper_bounds_.begin());
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
}

Status Histogram::AddBucketed(const std::vector<uint64_t>& counts, double sum) {
  if (counts.size() != upper_bounds_.size() + 1) {
    return Status::InvalidArgument("histogram: " + std::to_string(counts.size()) +
                                   " bucket counts given, " +
                                   std::to_string(upper_bounds_.size() + 1) + " buckets exist");
  }
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] != 0) counts_[i].fetch_add(counts[i], std::memory_order_relaxed);
  }
  sum_.fetch_add(sum, std::memory_order_relaxed);
  return Status::Ok();
}

Histogram::Snapshot Histogram::Take() const {
  Snapshot snap;
  snap.cumulative.resize(upper_bounds_.size() + 1);
  uint64_t running = 0;
  for (size_t i = 0; i <= upper_bounds_.size(); ++i) {
    running += counts_[i].load(std::memory_order_relaxed);
    snap.cumulative[i] = running;
  }
  snap.count = running;
  snap.sum = sum_.load(std::memory_order_relaxed);
  return snap;
}

// ---- Families -----------------------------------------------------------------------------------

template <class T>
Result<T*> MetricFamily<T>::WithLabels(const std::vector<std::string>& values) {
  if (values.size() != label_names_.size()) {
    return Status::InvalidArgument("metric '" + name_ + "': expected " +
                                   std::to_string(label_names_.size()) + " label value(s), got " +
                                   std::to_string(values.size()));
  }
  MutexLock lock(&mu_);
  auto it = children_.find(values);
  if (it != children_.end()) return it->second.get();
  std::unique_ptr<T> child;
  if constexpr (std::is_same_v<T, Histogram>) {
    child = std::make_unique<Histogram>(buckets_);
  } else {
    child = std::make_unique<T>();
  }
  T* raw = child.get();
  children_.emplace(values, std::move(child));
  return raw;
}

template <class T>
void MetricFamily<T>::Remove(const std::vector<std::string>& values) {
  MutexLock lock(&mu_);
  children_.erase(values);
}

template class MetricFamily<Counter>;
template class MetricFamily<Gauge>;
template class MetricFamily<Histogram>;

// ---- Registry -----------------------------------------------------------------------------------

struct MetricsRegistry::Entry {
  MetricType type = MetricType::kCounter;
  std::string name;  // counters without "_total"
  std::string help;
  std::unique_ptr<CounterFamily> counter;
  std::unique_ptr<GaugeFamily> gauge;
  std::unique_ptr<HistogramFamily> histogram;
};

MetricsRegistry::MetricsRegistry() = default;
MetricsRegistry::~MetricsRegistry() = default;

Status MetricsRegistry::Reserve(const std::string& name, MetricType type) {
  std::vector<std::string> names;
  switch (type) {
    case MetricType::kCounter:
      names = {name, name + "_total", name + "_created"};
      break;
    case MetricType::kGauge:
      names = {name};
      break;
    case MetricType::kHistogram:
      names = {name, name + "_bucket", name + "_sum", name + "_count", name + "_created"};
      break;
  }
  for (const std::string& n : names) {
    if (taken_.contains(n)) {
      return Status::AlreadyExists("metric '" + name + "' (" + std::string(MetricTypeName(type)) +
                                   "): the name '" + n + "' is already registered");
    }
  }
  taken_.insert(names.begin(), names.end());
  return Status::Ok();
}

template <class T>
Result<MetricFamily<T>*> MetricsRegistry::Add(MetricType type, std::string name, std::string help,
                                              std::vector<std::string> label_names,
                                              std::vector<double> buckets) {
  if (type == MetricType::kCounter && name.size() > kTotalSuffix.size() &&
      name.ends_with(kTotalSuffix)) {
    name.resize(name.size() - kTotalSuffix.size());
  }
  if (!IsValidMetricName(name)) {
    return Status::InvalidArgument("metric name '" + name +
                                   "' is invalid (allowed: [a-zA-Z_:][a-zA-Z0-9_:]*)");
  }
  KVO_RETURN_IF_ERROR(ValidateLabelNames(name, label_names, type));
  if (type == MetricType::kHistogram) {
    if (buckets.empty()) {
      return Status::InvalidArgument("histogram '" + name + "': needs at least one bucket");
    }
    for (size_t i = 0; i < buckets.size(); ++i) {
      if (!std::isfinite(buckets[i]) || (i > 0 && !(buckets[i] > buckets[i - 1]))) {
        return Status::InvalidArgument("histogram '" + name + "': bucket " + std::to_string(i) +
                                       " (" + FormatMetricValue(buckets[i]) +
                                       ") must be finite and greater than the one before; "
                                       "+Inf is implicit");
      }
    }
  }
  MutexLock lock(&mu_);
  KVO_RETURN_IF_ERROR(Reserve(name, type));
  auto entry = std::make_unique<Entry>();
  entry->type = type;
  entry->name = name;
  entry->help = std::move(help);
  auto* family = new MetricFamily<T>(std::move(name), std::move(label_names), std::move(buckets));
  if constexpr (std::is_same_v<T, Counter>) {
    entry->counter.reset(family);
  } else if constexpr (std::is_same_v<T, Gauge>) {
    entry->gauge.reset(family);
  } else {
    entry->histogram.reset(family);
  }
  entries_.push_back(std::move(entry));
  return family;
}

Result<CounterFamily*> MetricsRegistry::AddCounterFamily(std::string name, std::string help,
                                                         std::vector<std::string> label_names) {
  return Add<Counter>(MetricType::kCounter, std::move(name), std::move(help),
                      std::move(label_names), {});
}

Result<GaugeFamily*> MetricsRegistry::AddGaugeFamily(std::string name, std::string help,
                                                     std::vector<std::string> label_names) {
  return Add<Gauge>(MetricType::kGauge, std::move(name), std::move(help), std::move(label_names),
                    {});
}

Result<HistogramFamily*> MetricsRegistry::AddHistogramFamily(std::string name, std::string help,
                                                             std::vector<double> buckets,
                                                             std::vector<std::string> label_names) {
  return Add<Histogram>(MetricType::kHistogram, std::move(name), std::move(help),
                        std::move(label_names), std::move(buckets));
}

Result<Counter*> MetricsRegistry::AddCounter(std::string name, std::string help) {
  KVO_ASSIGN_OR_RETURN(CounterFamily * family, AddCounterFamily(std::move(name), std::move(help)));
  return family->WithLabels({});
}

Result<Gauge*> MetricsRegistry::AddGauge(std::string name, std::string help) {
  KVO_ASSIGN_OR_RETURN(GaugeFamily * family, AddGaugeFamily(std::move(name), std::move(help)));
  return family->WithLabels({});
}

Result<Histogram*> MetricsRegistry::AddHistogram(std::string name, std::string help,
                                                 std::vector<double> buckets) {
  KVO_ASSIGN_OR_RETURN(HistogramFamily * family,
                       AddHistogramFamily(std::move(name), std::move(help), std::move(buckets)));
  return family->WithLabels({});
}

std::vector<std::string> MetricsRegistry::FamilyNames() const {
  MutexLock lock(&mu_);
  std::vector<std::string> names;
  names.reserve(entries_.size());
  for (const auto& e : entries_) names.push_back(e->name);
  return names;
}

std::string MetricsRegistry::RenderPrometheus() const {
  std::string out;
  MutexLock lock(&mu_);
  for (const auto& e : entries_) {
    const std::string exposed = e->type == MetricType::kCounter ? e->name + "_total" : e->name;
    out += "# HELP " + exposed + " " + EscapeHelp(e->help) + "\n";
    out += "# TYPE " + exposed + " " + std::string(MetricTypeName(e->type)) + "\n";
    switch (e->type) {
      case MetricType::kCounter: {
        MutexLock family_lock(&e->counter->mu_);
        for (const auto& [values, child] : e->counter->children_) {
          AppendSample(&out, exposed, RenderLabels(e->counter->label_names_, values),
                       child->Value());
        }
        break;
      }
      case MetricType::kGauge: {
        MutexLock family_lock(&e->gauge->mu_);
        for (const auto& [values, child] : e->gauge->children_) {
          AppendSample(&out, exposed, RenderLabels(e->gauge->label_names_, values), child->Value());
        }
        break;
      }
      case MetricType::kHistogram: {
        const HistogramFamily& h = *e->histogram;
        MutexLock family_lock(&h.mu_);
        for (const auto& [values, child] : h.children_) {
          const Histogram::Snapshot snap = child->Take();
          const std::string bucket_name = exposed + "_bucket";
          for (size_t i = 0; i <= h.buckets_.size(); ++i) {
            const std::string le =
                i < h.buckets_.size() ? FormatMetricValue(h.buckets_[i]) : "+Inf";
            AppendSample(&out, bucket_name, RenderLabels(h.label_names_, values, "le", le),
                         static_cast<double>(snap.cumulative[i]));
          }
          const std::string labels = RenderLabels(h.label_names_, values);
          AppendSample(&out, exposed + "_count", labels, static_cast<double>(snap.count));
          AppendSample(&out, exposed + "_sum", labels, snap.sum);
        }
        break;
      }
    }
  }
  return out;
}

}  // namespace kvo
