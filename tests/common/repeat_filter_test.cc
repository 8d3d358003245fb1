// RepeatFilter: the 1st, 2nd, 4th, ... of a run of identical warnings are logged, a changed text
// is logged at once, and the "left out" counts add up to every occurrence not logged.
#include "common/repeat_filter.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "tests/testing/temp_dir.h"

namespace kvo {
namespace {

TEST(RepeatFilterTest, LogsPowersOfTwoOfARunAndSaysHowManyWereLeftOut) {
  RepeatFilter f;
  std::vector<int64_t> logged;
  std::vector<int64_t> skipped;
  for (int i = 1; i <= 20; ++i) {
    RepeatFilter::Decision d = f.Note("EADDRINUSE");
    EXPECT_EQ(d.run, i);
    if (d.log) {
      logged.push_back(d.run);
      skipped.push_back(d.skipped);
    }
  }
  EXPECT_EQ(logged, (std::vector<int64_t>{1, 2, 4, 8, 16}));
  EXPECT_EQ(skipped, (std::vector<int64_t>{0, 0, 1, 3, 7}));
  EXPECT_EQ(f.Reset(), 20);
  EXPECT_EQ(f.Reset(), 0);
  RepeatFilter::Decision again = f.Note("EADDRINUSE");  // a new run after the condition cleared
  EXPECT_TRUE(again.log);
  EXPECT_EQ(again.run, 1);
  EXPECT_EQ(again.skipped, 0);  // what was left out before the reset was already summed up
}

TEST(RepeatFilterTest, AChangedTextIsLoggedAtOnceAndCarriesTheCountLeftOut) {
  RepeatFilter f;
  EXPECT_EQ(f.Note("a").Describe(), "");
  EXPECT_EQ(f.Note("a").Describe(), "; 2 in a row");
  EXPECT_FALSE(f.Note("a").log);
  RepeatFilter::Decision d = f.Note("b");
  EXPECT_TRUE(d.log);
  EXPECT_EQ(d.run, 1);
  EXPECT_EQ(d.skipped, 1);
  EXPECT_EQ(d.Describe(), "; 1 not logged since the last such line");
  EXPECT_EQ(f.Note("b").Describe(), "; 2 in a row");
  EXPECT_FALSE(f.Note("b").log);
  EXPECT_EQ(f.Note("b").Describe(), "; 4 in a row, 1 not logged since the last such line");
  RepeatFilter::Decision e = f.Note("a");
  EXPECT_TRUE(e.log);
  EXPECT_EQ(e.run, 1);
  EXPECT_EQ(e.skipped, 0);
}

// Random texts from a small alphabet and random resets, against a model written the long way:
// every occurrence is logged, or counted once in a later logged line's `skipped`, or still
// pending, or forgotten by a reset, a run of n logs floor(log2 n) + 1 lines, and a text change is
// always logged.
TEST(RepeatFilterTest, PropertyEveryOccurrenceIsLoggedOrCounted) {
  const unsigned seed = testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 200; ++trial) {
    RepeatFilter f;
    std::string prev;
    int64_t run = 0;
    int64_t logged_in_run = 0;
    int64_t total = 0;
    int64_t logged = 0;
    int64_t counted = 0;
    int64_t pending = 0;    // not logged since the last logged line (or reset)
    int64_t forgotten = 0;  // pending at a reset: the condition cleared, nothing left to say
    auto end_run = [&] {
      if (run == 0) return;
      int64_t want = 0;
      for (int64_t p = 1; p <= run; p *= 2) ++want;
      EXPECT_EQ(logged_in_run, want) << "run of " << run;
    };
    const int steps = static_cast<int>(rng() % 300);
    for (int i = 0; i < steps; ++i) {
      if (rng() % 50 == 0) {
        end_run();
        EXPECT_EQ(f.Reset(), run);
        forgotten += pending;
        pending = 0;
        run = 0;
        logged_in_run = 0;
        prev.clear();
        continue;
      }
      std::string text(1, static_cast<char>('a' + rng() % 3));
      if (run > 0 && text != prev) {
        end_run();
        run = 0;
        logged_in_run = 0;
      }
      ++run;
      ++total;
      RepeatFilter::Decision d = f.Note(text);
      EXPECT_EQ(d.run, run);
      if (run == 1) {
        EXPECT_TRUE(d.log) << "a changed text is logged at once";
      }
      if (d.log) {
        ++logged;
        ++logged_in_run;
        EXPECT_EQ(d.skipped, pending);
        counted += d.skipped;
        pending = 0;
      } else {
        ++pending;
      }
      prev = text;
    }
    end_run();
    EXPECT_EQ(logged + counted + pending + forgotten, total);
  }
}

}  // namespace
}  // namespace kvo
