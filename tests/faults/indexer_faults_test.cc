// Indexer faults, from outside: the real `kvo index serve` daemon killed with SIGKILL at random
// moments while a journaled publisher streams; after every kill the file must be exactly the fold
// of the batches up to its checkpoint, and after the restarts the index must converge to the
// publisher's state (digest), no batch lost or applied twice. Seeds printed; replay with
// KVO_TEST_SEED.
#include <signal.h>

#include <chrono>
#include <random>
#include <string>

#include <gtest/gtest.h>

#include "tests/faults/indexer_harness.h"
#include "tests/testing/fault_report.h"
#include "tests/testing/temp_dir.h"

namespace kvo::faults {
namespace {

// The first (hash, medium) where two holdings differ, for the failure message.
std::string FirstDifference(const Holdings& got, const Holdings& want) {
  for (const auto& [k, ref] : want) {
    auto it = got.find(k);
    if (it == got.end() || it->second != ref) {
      return "hash " + Hex(k.first) + " " + k.second + ": want refcount " + std::to_string(ref) +
             ", index has " + (it == got.end() ? "none" : std::to_string(it->second));
    }
  }
  for (const auto& [k, ref] : got) {
    if (!want.count(k)) {
      return "hash " + Hex(k.first) + " " + k.second + ": index has refcount " +
             std::to_string(ref) + ", the publisher's state has none";
    }
  }
  return "none";
}

TEST(IndexerFaultTest, KillNineOfTheDaemonWhileAJournaledPublisherStreams) {
  const unsigned seed = testing::TestSeed();
  std::printf("seed %u (replay: KVO_TEST_SEED=%u)\n", seed, seed);
  std::mt19937_64 rng(seed);
  testing::TempDir dir;
  const std::string db = dir.path() + "/index.sqlite";
  const int port = FreePortPair();
  ChurnPublisher pub(port, dir.path() + "/journal", seed);
  const std::vector<std::string> sources = {pub.source_flag("engine")};
  pub.Start(std::chrono::microseconds(500));

  const int trials = testing::FaultTrials(6, 40);
  int64_t failures = 0;
  int64_t checked_nonempty = 0;
  for (int trial = 0; trial < trials; ++trial) {
    IndexDaemon daemon(db, sources);
    ASSERT_GT(daemon.port(), 0);
    // Let it ingest (and, after a restart, catch up by replay) for a random while, then kill.
    std::this_thread::sleep_for(std::chrono::milliseconds(100 + rng() % 900));  // the fault's moment
    daemon.Kill();
    // The file after kill -9: exactly the fold of the batches up to its checkpoint.
    const std::optional<uint64_t> ck = Checkpoint(db, "engine");
    bool ok = false;
    std::string err;
    const Holdings got = DumpIndex(db, "engine", &ok, &err);
    EXPECT_TRUE(ok) << "kvo index dump after kill " << trial << ": " << err;
    const Holdings want = ck ? pub.Expected(*ck) : Holdings{};
    if (!ok || got != want) {
      ++failures;
      ADD_FAILURE() << "trial " << trial << " (seed " << seed << "): after kill -9 the index at "
                    << "checkpoint " << (ck ? std::to_string(*ck) : "none")
                    << " is not the fold of the batches up to it; first difference: "
                    << FirstDifference(got, want);
    }
    checked_nonempty += want.empty() ? 0 : 1;
  }
  // Converge: stop publishing, restart once more, wait for the last sequence, stop cleanly.
  pub.Pause();
  const std::optional<uint64_t> last = pub.LastSeq();
  ASSERT_TRUE(last.has_value());
  Holdings final_got;
  const Holdings final_want = pub.Expected(*last);
  {
    IndexDaemon daemon(db, sources);
    ASSERT_GT(daemon.port(), 0);
    const auto t0 = SteadyClock::now();
    const bool caught_up = daemon.WaitForSequence("engine", *last, std::chrono::seconds(120));
    const double catch_up_s = std::chrono::duration<double>(SteadyClock::now() - t0).count();
    EXPECT_TRUE(caught_up) << "the restarted daemon never reached seq " << *last << "; stderr:\n"
                           << daemon.child().err();
    EXPECT_EQ(daemon.Terminate(), 0) << daemon.child().err();
    std::printf("caught up to seq %llu in %.2f s\n", static_cast<unsigned long long>(*last),
                catch_up_s);
  }
  bool ok = false;
  std::string err;
  final_got = DumpIndex(db, "engine", &ok, &err);
  ASSERT_TRUE(ok) << err;
  const bool converged = final_got == final_want && Checkpoint(db, "engine") == last;
  if (!converged) ++failures;
  EXPECT_TRUE(converged) << "seed " << seed << ": the index did not converge to the publisher's "
                         << "state; digest " << Hex(Digest(final_got)) << " vs "
                         << Hex(Digest(final_want))
                         << "; first difference: " << FirstDifference(final_got, final_want);
  ReportFault({"indexer",
               "kill -9 of `kvo index serve` at a random moment (0.1-1 s after its start) while a "
               "journaled publisher streams 2000 batches/s of stores, removals and clears",
               trials,
               "after each kill: `kvo index dump` equals the fold of the published batches up to "
               "the file's checkpoint; after a restart: the index converges to the publisher's "
               "state (digest equal, checkpoint = last seq: no batch lost or applied twice)",
               failures, seed,
               std::to_string(*last + 1) + " batches, " + std::to_string(final_want.size()) +
                   " entries at the end, digest " + Hex(Digest(final_want)) + ", " +
                   std::to_string(checked_nonempty) + " kills on a non-empty checkpoint"});
}

}  // namespace
}  // namespace kvo::faults
