#include "common/metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

namespace kvo {
namespace {

TEST(MetricsTest, RendersASmallRegistryExactly) {
  MetricsRegistry registry;
  auto requests = registry.AddCounter("app_requests", "Requests served.");
  ASSERT_TRUE(requests.ok()) << requests.status().ToString();
  auto temp = registry.AddGauge("app_temperature", "Temperature in \\ degrees\nCelsius.");
  ASSERT_TRUE(temp.ok());
  auto bytes = registry.AddCounterFamily("app_bytes_total", "Bytes moved.", {"tier", "dir"});
  ASSERT_TRUE(bytes.ok());
  auto latency =
      registry.AddHistogramFamily("app_latency_seconds", "Latency.", {0.5, 1, 2.5}, {"op"});
  ASSERT_TRUE(latency.ok());
  auto empty = registry.AddGaugeFamily("app_unused", "Never set.", {"x"});
  ASSERT_TRUE(empty.ok());

  (*requests)->Increment();
  (*requests)->Increment(2);
  (*temp)->Set(-3.25);
  (*(*bytes)->WithLabels({"2:fs", "read"}))->Increment(1e6);
  (*(*bytes)->WithLabels({"1:fs", "write"}))->Increment(4096);
  Histogram* get = *(*latency)->WithLabels({"get"});
  get->Observe(0.5);  // le is inclusive
  get->Observe(0.75);
  get->Observe(7);

  EXPECT_EQ(registry.RenderPrometheus(),
            "# HELP app_requests_total Requests served.\n"
            "# TYPE app_requests_total counter\n"
            "app_requests_total 3.0\n"
            "# HELP app_temperature Temperature in \\\\ degrees\\nCelsius.\n"
            "# TYPE app_temperature gauge\n"
            "app_temperature -3.25\n"
            "# HELP app_bytes_total Bytes moved.\n"
            "# TYPE app_bytes_total counter\n"
            "app_bytes_total{tier=\"1:fs\",dir=\"write\"} 4096.0\n"
            "app_bytes_total{tier=\"2:fs\",dir=\"read\"} 1e+06\n"
            "# HELP app_latency_seconds Latency.\n"
            "# TYPE app_latency_seconds histogram\n"
            "app_latency_seconds_bucket{op=\"get\",le=\"0.5\"} 1.0\n"
            "app_latency_seconds_bucket{op=\"get\",le=\"1.0\"} 2.0\n"
            "app_latency_seconds_bucket{op=\"get\",le=\"2.5\"} 2.0\n"
            "app_latency_seconds_bucket{op=\"get\",le=\"+Inf\"} 3.0\n"
            "app_latency_seconds_count{op=\"get\"} 3.0\n"
            "app_latency_seconds_sum{op=\"get\"} 8.25\n"
            "# HELP app_unused Never set.\n"
            "# TYPE app_unused gauge\n");
  EXPECT_EQ(registry.FamilyNames(),
            (std::vector<std::string>{"app_requests", "app_temperature", "app_bytes",
                                      "app_latency_seconds", "app_unused"}));
}

TEST(MetricsTest, EscapesLabelValues) {
  EXPECT_EQ(EscapeLabelValue(R"(a\b"c)"
                             "\n"
                             "d"),
            R"(a\\b\"c\nd)");
  EXPECT_EQ(EscapeHelp("say \"hi\"\\\n"), "say \"hi\"\\\\\\n");

  MetricsRegistry registry;
  auto family = registry.AddCounterFamily("paths", "Paths.", {"path"});
  ASSERT_TRUE(family.ok());
  (*(*family)->WithLabels({"C:\\dir\n\"x\""}))->Increment();
  EXPECT_NE(registry.RenderPrometheus().find("paths_total{path=\"C:\\\\dir\\n\\\"x\\\"\"} 1.0\n"),
            std::string::npos)
      << registry.RenderPrometheus();
}

TEST(MetricsTest, FormatsNumbersAsPrometheusClient) {
  EXPECT_EQ(FormatMetricValue(0), "0.0");
  EXPECT_EQ(FormatMetricValue(1), "1.0");
  EXPECT_EQ(FormatMetricValue(0.1), "0.1");
  EXPECT_EQ(FormatMetricValue(2.5), "2.5");
  EXPECT_EQ(FormatMetricValue(-3.0), "-3.0");
  EXPECT_EQ(FormatMetricValue(262144), "262144.0");
  EXPECT_EQ(FormatMetricValue(999999), "999999.0");
  EXPECT_EQ(FormatMetricValue(1e6), "1e+06");
  EXPECT_EQ(FormatMetricValue(2e8), "2e+08");
  EXPECT_EQ(FormatMetricValue(1234567), "1.234567e+06");
  EXPECT_EQ(FormatMetricValue(1000000.5), "1.0000005e+06");
  EXPECT_EQ(FormatMetricValue(1e15), "1e+015");  // floatToGoString's own quirk, kept
  EXPECT_EQ(FormatMetricValue(1e16), "1e+16");
  EXPECT_EQ(FormatMetricValue(0.0001), "0.0001");
  EXPECT_EQ(FormatMetricValue(0.00001), "1e-05");
  EXPECT_EQ(FormatMetricValue(1.5e-7), "1.5e-07");
  EXPECT_EQ(FormatMetricValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatMetricValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(FormatMetricValue(std::nan("")), "NaN");
}

TEST(MetricsTest, ValidatesNames) {
  EXPECT_TRUE(IsValidMetricName("vllm:kv_offload_cpu_cache_usage_perc"));
  EXPECT_TRUE(IsValidMetricName("_x:y9"));
  EXPECT_FALSE(IsValidMetricName(""));
  EXPECT_FALSE(IsValidMetricName("9lives"));
  EXPECT_FALSE(IsValidMetricName("a-b"));
  EXPECT_FALSE(IsValidMetricName("a b"));
  EXPECT_TRUE(IsValidLabelName("tier"));
  EXPECT_FALSE(IsValidLabelName("ti:er"));
  EXPECT_FALSE(IsValidLabelName("1x"));

  MetricsRegistry registry;
  auto bad = registry.AddGauge("bad-name", "x");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'bad-name'"), std::string::npos);

  auto bad_label = registry.AddCounterFamily("c", "x", {"ok", "no-dash"});
  ASSERT_FALSE(bad_label.ok());
  EXPECT_NE(bad_label.status().message().find("'no-dash'"), std::string::npos);
  EXPECT_FALSE(registry.AddCounterFamily("c", "x", {"__reserved"}).ok());
  EXPECT_FALSE(registry.AddCounterFamily("c", "x", {"a", "a"}).ok());
  EXPECT_FALSE(registry.AddHistogramFamily("h", "x", {1}, {"le"}).ok());
  EXPECT_FALSE(registry.AddHistogram("h", "x", {}).ok());
  EXPECT_FALSE(registry.AddHistogram("h", "x", {2, 1}).ok());
  EXPECT_FALSE(registry.AddHistogram("h", "x", {1, 1}).ok());
  EXPECT_FALSE(registry.AddHistogram("h", "x", {1, std::numeric_limits<double>::infinity()}).ok());
  // None of the failures registered anything.
  EXPECT_TRUE(registry.FamilyNames().empty());
}

TEST(MetricsTest, RejectsCollidingNames) {
  MetricsRegistry registry;
  ASSERT_TRUE(registry.AddCounter("jobs", "x").ok());
  auto again = registry.AddCounter("jobs_total", "x");  // the same family
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kAlreadyExists);
  EXPECT_FALSE(registry.AddGauge("jobs_total", "x").ok());
  ASSERT_TRUE(registry.AddHistogram("lat", "x", {1}).ok());
  EXPECT_FALSE(registry.AddGauge("lat_count", "x").ok());
  EXPECT_FALSE(registry.AddGauge("lat_bucket", "x").ok());
  EXPECT_TRUE(registry.AddGauge("lat_other", "x").ok());
}

TEST(MetricsTest, WrongNumberOfLabelValuesIsAnError) {
  MetricsRegistry registry;
  auto family = registry.AddGaugeFamily("g", "x", {"a", "b"});
  ASSERT_TRUE(family.ok());
  auto child = (*family)->WithLabels({"only-one"});
  ASSERT_FALSE(child.ok());
  EXPECT_EQ(child.status().code(), StatusCode::kInvalidArgument);
  // The same values give the same child.
  EXPECT_EQ(*(*family)->WithLabels({"x", "y"}), *(*family)->WithLabels({"x", "y"}));
}

TEST(MetricsTest, CounterNeverDecreasesGaugeDoes) {
  MetricsRegistry registry;
  Counter* c = *registry.AddCounter("c", "x");
  c->Increment(2);
  c->Increment(-1);
  c->Increment(std::nan(""));
  EXPECT_EQ(c->Value(), 2);
  Gauge* g = *registry.AddGauge("g", "x");
  g->Increment(5);
  g->Decrement(7);
  EXPECT_EQ(g->Value(), -2);
}

TEST(MetricsTest, ConcurrentUpdatesAndRendersAreConsistent) {
  MetricsRegistry registry;
  CounterFamily* counters = *registry.AddCounterFamily("ops", "x", {"thread"});
  Counter* shared = *registry.AddCounter("shared", "x");
  Gauge* gauge = *registry.AddGauge("level", "x");
  Histogram* hist = *registry.AddHistogram("sizes", "x", {1, 4, 16, 64});

  constexpr int kThreads = 8;
  constexpr int kIters = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Counter* mine = *counters->WithLabels({std::to_string(t % 4)});
      for (int i = 0; i < kIters; ++i) {
        mine->Increment();
        shared->Increment();
        gauge->Increment();
        gauge->Decrement();
        hist->Observe(static_cast<double>(i % 100));
        if (i % 5000 == 0) {
          // Renders race with updates; each must still be internally consistent.
          std::string text = registry.RenderPrometheus();
          EXPECT_NE(text.find("# TYPE sizes histogram"), std::string::npos);
        }
      }
    });
  }
  for (auto& th : threads) th.join();

  EXPECT_EQ(shared->Value(), kThreads * kIters);
  EXPECT_EQ(gauge->Value(), 0);
  double per_label = 0;
  for (int l = 0; l < 4; ++l) per_label += (*counters->WithLabels({std::to_string(l)}))->Value();
  EXPECT_EQ(per_label, kThreads * kIters);
  Histogram::Snapshot snap = hist->Take();
  EXPECT_EQ(snap.count, static_cast<uint64_t>(kThreads * kIters));
  EXPECT_EQ(snap.cumulative.back(), snap.count);
  // i % 100 in [0, 99]: 2 values <= 1, 5 <= 4, 17 <= 16, 65 <= 64 per 100.
  EXPECT_EQ(snap.cumulative[0], static_cast<uint64_t>(kThreads * kIters / 100 * 2));
  EXPECT_EQ(snap.cumulative[3], static_cast<uint64_t>(kThreads * kIters / 100 * 65));
  EXPECT_NE(registry.RenderPrometheus().find("shared_total 160000.0\n"), std::string::npos);
}

// Remove drops one child from the rendering; the others stay, and the same labels later start a
// fresh child at zero (an unregistered stream registered again).
TEST(MetricsTest, RemoveDropsOneChildAndTheSameLabelsStartAgainAtZero) {
  MetricsRegistry reg;
  auto family = reg.AddCounterFamily("kvo_test_batches", "Batches", {"source"});
  ASSERT_TRUE(family.ok());
  Counter* a = *(*family)->WithLabels({"a"});
  Counter* b = *(*family)->WithLabels({"b"});
  a->Increment(5);
  b->Increment(7);
  (*family)->Remove({"a"});
  (*family)->Remove({"never-added"});  // nothing to drop: no effect
  std::string text = reg.RenderPrometheus();
  EXPECT_EQ(text.find("source=\"a\""), std::string::npos) << text;
  EXPECT_NE(text.find("kvo_test_batches_total{source=\"b\"} 7.0"), std::string::npos) << text;
  Counter* again = *(*family)->WithLabels({"a"});
  EXPECT_EQ(again->Value(), 0.0);
  EXPECT_NE(reg.RenderPrometheus().find("kvo_test_batches_total{source=\"a\"} 0.0"),
            std::string::npos);
}

}  // namespace
}  // namespace kvo
