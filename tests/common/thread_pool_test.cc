#include "common/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>

namespace kvo {
namespace {

TEST(ThreadPoolTest, RunsEveryTaskAndWaitsForIdle) {
  ThreadPool pool(3, "test");
  std::atomic<int> sum{0};
  for (int i = 1; i <= 1000; ++i) pool.Schedule([&sum, i] { sum += i; });
  pool.WaitIdle();
  EXPECT_EQ(sum.load(), 500500);
}

TEST(ThreadPoolTest, DestructorDrainsScheduledWork) {
  std::atomic<int> ran{0};
  {
    ThreadPool pool(1, "drain");
    for (int i = 0; i < 100; ++i) pool.Schedule([&ran] { ++ran; });
  }
  EXPECT_EQ(ran.load(), 100);
}

TEST(ThreadPoolTest, TasksMayScheduleMoreTasks) {
  ThreadPool pool(2, "nested");
  std::atomic<int> ran{0};
  for (int i = 0; i < 10; ++i) {
    pool.Schedule([&] {
      ++ran;
      pool.Schedule([&ran] { ++ran; });
    });
  }
  pool.WaitIdle();
  EXPECT_EQ(ran.load(), 20);
}

}  // namespace
}  // namespace kvo
