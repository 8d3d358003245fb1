// Soak: the real `kvo index serve` daemon under churn (a journaled publisher storing and removing
// blocks continuously) with faults injected (a kill -9 and restart of the daemon, which catches up
// by replay; a restart of the publisher), its resident set sampled from /proc. After warm-up the
// RSS must be flat: the least-squares slope is reported and a clear upward trend fails the test.
// ~40 s in quick mode, 5 min with KVO_FAULTS=long. The SQLite page cache is part of the daemon's
// memory budget (indexer/DESIGN.md): --memory-budget-mb bounds both.
#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/faults/indexer_harness.h"
#include "tests/testing/fault_report.h"
#include "tests/testing/temp_dir.h"

namespace kvo::faults {
namespace {

struct Sample {
  double t;  // seconds since the start
  double rss;
};

// Least-squares slope of rss over t (bytes per second).
double Slope(const std::vector<Sample>& s) {
  double n = 0, st = 0, sr = 0, stt = 0, str = 0;
  for (const Sample& x : s) {
    n += 1;
    st += x.t;
    sr += x.rss;
    stt += x.t * x.t;
    str += x.t * x.rss;
  }
  const double den = n * stt - st * st;
  return den > 0 ? (n * str - st * sr) / den : 0;
}

TEST(IndexerSoakTest, RssFlatUnderChurnWithRestartsAndReplay) {
  const unsigned seed = testing::TestSeed();
  std::printf("seed %u (replay: KVO_TEST_SEED=%u)\n", seed, seed);
  // Keep ASan's quarantine from looking like growth: it fills to its cap (256 MiB by default)
  // whatever the program does.
  std::string asan = std::getenv("ASAN_OPTIONS") ? std::getenv("ASAN_OPTIONS") : "";
  ::setenv("ASAN_OPTIONS", (asan + (asan.empty() ? "" : ":") + "quarantine_size_mb=4").c_str(), 1);

  // $KVO_SOAK_SECONDS overrides the duration (investigations).
  const char* env_s = std::getenv("KVO_SOAK_SECONDS");
  const double total_s = env_s != nullptr && std::atof(env_s) > 10 ? std::atof(env_s)
                         : testing::LongFaultRun()                 ? 300
                                                                   : 40;
  const double restart_daemon_at = 0.1 * total_s;
  const double warm_up_until = 0.4 * total_s;
  const double restart_publisher_at = 0.6 * total_s;

  testing::TempDir dir;
  const std::string db = dir.path() + "/soak.sqlite";
  const int port = FreePortPair();
  ChurnPublisher pub(port, dir.path() + "/journal", seed, /*pool=*/3000);
  const std::vector<std::string> sources = {pub.source_flag("engine")};
  const std::vector<std::string> budget = {"--memory-budget-mb", "32"};
  pub.Start(std::chrono::microseconds(500));

  auto daemon = std::make_unique<IndexDaemon>(db, sources, budget);
  ASSERT_GT(daemon->port(), 0);
  const auto t0 = SteadyClock::now();
  auto now_s = [&] { return std::chrono::duration<double>(SteadyClock::now() - t0).count(); };
  std::vector<Sample> measured;
  int64_t peak = 0, healthz_failures = 0, samples = 0;
  bool daemon_restarted = false, publisher_restarted = false;
  while (now_s() < total_s) {
    if (!daemon_restarted && now_s() >= restart_daemon_at) {
      daemon->Kill();  // fault: kill -9; the new daemon catches up by replay from the journal
      daemon = std::make_unique<IndexDaemon>(db, sources, budget);
      ASSERT_GT(daemon->port(), 0);
      daemon_restarted = true;
    }
    if (!publisher_restarted && now_s() >= restart_publisher_at) {
      pub.Stop();  // fault: the publisher restarts on its journal (sequence numbers continue)
      pub.Open();
      pub.Start(std::chrono::microseconds(500));
      publisher_restarted = true;
    }
    const int64_t rss = RssBytes(daemon->pid());
    ASSERT_GT(rss, 0) << "daemon gone; stderr:\n" << daemon->child().err();
    peak = std::max(peak, rss);
    ++samples;
    if (now_s() >= warm_up_until) measured.push_back({now_s(), static_cast<double>(rss)});
    if (std::getenv("KVO_SOAK_TRACE"))
      std::printf("t %.1f rss %.1f MiB\n", now_s(), rss / 1048576.0);
    if (HttpGet(daemon->port(), "/healthz", 5000).status != 200) ++healthz_failures;
    daemon->child().Drain();
    std::this_thread::sleep_for(std::chrono::milliseconds(250));  // the sampling period
  }
  pub.Pause();
  const std::optional<uint64_t> last = pub.LastSeq();
  ASSERT_TRUE(last.has_value());
  const bool caught_up = daemon->WaitForSequence("engine", *last, std::chrono::seconds(120));
  EXPECT_TRUE(caught_up) << daemon->child().err();
  EXPECT_EQ(daemon->Terminate(), 0) << daemon->child().err();
  bool ok = false;
  std::string err;
  const Holdings got = DumpIndex(db, "engine", &ok, &err);
  ASSERT_TRUE(ok) << err;
  const bool converged = got == pub.Expected(*last);
  EXPECT_TRUE(converged) << "after the soak the index is not the publisher's state";

  ASSERT_GE(measured.size(), 10u);
  double mean = 0;
  for (const Sample& s : measured) mean += s.rss;
  mean /= static_cast<double>(measured.size());
  const double slope = Slope(measured);  // bytes/s
  const double window = measured.back().t - measured.front().t;
  const double growth = slope * window;  // fitted growth over the measured window
  const double allowed = std::max(4.0 * 1024 * 1024, 0.05 * mean);
  char figures[320];
  std::snprintf(figures, sizeof figures,
                "RSS after warm-up: mean %.1f MiB, slope %+.1f KiB/min (fitted %+.2f MiB over "
                "%.0f s, limit %.1f MiB), peak %.1f MiB; %llu batches; %lld /healthz failures",
                mean / 1048576, slope * 60 / 1024, growth / 1048576, window, allowed / 1048576,
                static_cast<double>(peak) / 1048576, static_cast<unsigned long long>(*last + 1),
                static_cast<long long>(healthz_failures));
  std::printf("%s\n", figures);
  const bool flat = growth <= allowed;
  if (testing::MemoryAsserted()) {
    EXPECT_TRUE(flat) << "RSS grows after warm-up: " << figures;
  }
  EXPECT_EQ(healthz_failures, 0);
  testing::ReportFault(
      {"indexer",
       "soak: churn (a batch every 0.5 ms: stores, removals, clears) for " +
           std::to_string(static_cast<int>(total_s)) +
           " s, kill -9 + restart of the daemon (catch-up by replay), restart of the "
           "publisher; RSS sampled every 250 ms",
       1,
       "RSS flat after warm-up (fitted growth <= max(4 MiB, 5 % of mean)); /healthz "
       "answers throughout; the index equals the publisher's state at the end",
       (flat && converged && caught_up && healthz_failures == 0) ? 0 : 1, seed, figures});
}

}  // namespace
}  // namespace kvo::faults
