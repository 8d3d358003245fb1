// The job contract's shared pieces (transfer/job.h): the in-order-per-lane completion queue, and
// the host engine driven through it by a ManualExecutor (pieces run in an order the test picks).
#include "transfer/job.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "tests/testing/fake_jobs.h"
#include "tests/testing/manual_executor.h"
#include "tests/testing/temp_dir.h"
#include "transfer/transfer_engine.h"

namespace kvo {
namespace {

struct FakeJob {
  JobId id = 0;
  bool done = false;
};

bool IsDone(const FakeJob& j) { return j.done; }

// Random finishes over three lanes: every TakeFinished returns exactly each lane's finished
// prefix, in submission order, each job once; FinishedThrough agrees with the prefix rule.
TEST(InOrderJobQueueTest, ReturnsEachLanesFinishedPrefixOnce) {
  const unsigned seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  for (int round = 0; round < 50; ++round) {
    InOrderJobQueue<FakeJob, 3> q;
    std::vector<std::vector<std::shared_ptr<FakeJob>>> lanes(3);
    const int n = 1 + static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) {
      auto j = std::make_shared<FakeJob>();
      j->id = static_cast<JobId>(i + 1);
      const size_t lane = rng() % 3;
      lanes[lane].push_back(j);
      q.Push(lane, j);
    }
    std::vector<size_t> taken(3, 0);  // per lane, how many were returned
    std::set<JobId> seen;
    for (int step = 0; step < 200 && seen.size() < static_cast<size_t>(n); ++step) {
      // Finish a random unfinished job (any lane, any position).
      std::vector<FakeJob*> open;
      for (auto& l : lanes) {
        for (auto& j : l) {
          if (!j->done) open.push_back(j.get());
        }
      }
      if (!open.empty()) open[rng() % open.size()]->done = true;
      // FinishedThrough for every queued job: true iff it and all before it on its lane are done.
      for (size_t l = 0; l < 3; ++l) {
        bool prefix = true;
        for (size_t k = taken[l]; k < lanes[l].size(); ++k) {
          prefix = prefix && lanes[l][k]->done;
          auto through = q.FinishedThrough(lanes[l][k]->id, IsDone);
          ASSERT_TRUE(through.has_value()) << "seed " << seed;
          EXPECT_EQ(*through, prefix) << "seed " << seed << " job " << lanes[l][k]->id;
        }
      }
      std::map<JobId, size_t> lane_of;
      for (size_t l = 0; l < 3; ++l) {
        for (auto& j : lanes[l]) lane_of[j->id] = l;
      }
      std::vector<JobId> got;
      q.TakeFinished(IsDone, [&](const std::shared_ptr<FakeJob>& j) { got.push_back(j->id); });
      for (JobId id : got) {
        const size_t l = lane_of[id];
        ASSERT_LT(taken[l], lanes[l].size()) << "seed " << seed;
        EXPECT_EQ(id, lanes[l][taken[l]]->id) << "seed " << seed << ": out of order";
        EXPECT_TRUE(lanes[l][taken[l]]->done) << "seed " << seed << ": unfinished job returned";
        ++taken[l];
        EXPECT_TRUE(seen.insert(id).second) << "seed " << seed << ": job " << id << " twice";
        EXPECT_FALSE(q.FinishedThrough(id, IsDone).has_value());  // gone once taken
      }
      // What stays queued on a lane starts with an unfinished job.
      for (size_t l = 0; l < 3; ++l) {
        if (taken[l] < lanes[l].size()) {
          EXPECT_FALSE(lanes[l][taken[l]]->done) << "seed " << seed;
        }
      }
    }
    EXPECT_EQ(seen.size(), static_cast<size_t>(n)) << "seed " << seed;
    EXPECT_TRUE(q.empty());
    EXPECT_TRUE(q.AllFinished(IsDone));
  }
}

TEST(InOrderJobQueueTest, FindAndAllFinished) {
  InOrderJobQueue<FakeJob, 2> q;
  EXPECT_TRUE(q.AllFinished(IsDone));
  EXPECT_EQ(q.Find(1), nullptr);
  auto a = std::make_shared<FakeJob>(FakeJob{1, false});
  auto b = std::make_shared<FakeJob>(FakeJob{2, true});
  q.Push(0, a);
  q.Push(1, b);
  EXPECT_EQ(q.Find(1), a);
  EXPECT_EQ(q.Find(2), b);
  EXPECT_EQ(q.Find(3), nullptr);
  EXPECT_FALSE(q.FinishedThrough(3, IsDone).has_value());
  EXPECT_FALSE(q.AllFinished(IsDone));
  a->done = true;
  EXPECT_TRUE(q.AllFinished(IsDone));
}

// The contract's test double (tests/testing/fake_jobs.h, behind the manager's fake transports and
// tiers) keeps the contract: a job finishes only once and only if submitted; results come back in
// finish order, each exactly once.
TEST(FakeJobsTest, FinishesOnlySubmittedJobsAndReturnsEachResultOnce) {
  struct Job {
    JobId job_id = 0;
  };
  testing::FakeJobs<Job, JobResultFields> jobs;
  for (JobId id : {1, 2, 3}) jobs.Submit(Job{id});
  auto result = [](JobId id) {
    JobResultFields r;
    r.job_id = id;
    r.success = true;
    return r;
  };
  EXPECT_TRUE(jobs.Complete(3, result(3)));
  EXPECT_FALSE(jobs.Complete(3, result(3)));  // already finished
  EXPECT_FALSE(jobs.Complete(9, result(9)));  // never submitted
  EXPECT_TRUE(jobs.Complete(1, result(1)));
  ASSERT_NE(jobs.Find(2), nullptr);
  EXPECT_EQ(jobs.Find(1), nullptr);
  std::vector<JobResultFields> got;
  jobs.TakeFinished(&got);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].job_id, 3u);
  EXPECT_EQ(got[1].job_id, 1u);
  got.clear();
  jobs.TakeFinished(&got);
  EXPECT_TRUE(got.empty());
  jobs.Lose();  // a crash: job 2 never reports
  EXPECT_FALSE(jobs.Complete(2, result(2)));
  jobs.TakeFinished(&got);
  EXPECT_TRUE(got.empty());
}

// The host engine on a ManualExecutor: a later job of a direction whose copy ran first is not
// reported before the earlier one; the other direction is independent; bytes land as submitted.
TEST(InOrderJobQueueTest, HostEngineReportsInSubmissionOrderWhateverOrderPiecesRun) {
  testing::ManualExecutor exec;
  TransferEngineOptions o;
  o.executor = &exec;
  o.num_threads = 1;  // one piece per job
  auto engine = MakeTransferEngine("host", o);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  TransferEngine& e = **engine;
  std::vector<uint8_t> src(3 * 64), dst(3 * 64, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i + 1);
  auto job = [&](TransferDirection d, int slice) {
    TransferRequest r;
    r.direction = d;
    r.segments = {{reinterpret_cast<uintptr_t>(src.data() + slice * 64),
                   reinterpret_cast<uintptr_t>(dst.data() + slice * 64), 64}};
    auto id = e.Submit(std::move(r));
    EXPECT_TRUE(id.ok());
    return id.ok() ? *id : JobId{0};
  };
  const JobId a = job(TransferDirection::kGpuToCpu, 0);
  const JobId b = job(TransferDirection::kGpuToCpu, 1);
  const JobId c = job(TransferDirection::kCpuToGpu, 2);
  ASSERT_EQ(exec.pending(), 3u);
  std::vector<TransferResult> got;

  ASSERT_TRUE(exec.RunAt(1));  // b's copy first
  e.TakeFinished(&got);
  EXPECT_TRUE(got.empty()) << "b reported before a";
  EXPECT_EQ(0, std::memcmp(dst.data() + 64, src.data() + 64, 64));

  ASSERT_TRUE(exec.RunAt(1));  // c: the other direction is not held back by a
  e.TakeFinished(&got);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].job_id, c);
  EXPECT_EQ(got[0].direction, TransferDirection::kCpuToGpu);

  ASSERT_TRUE(exec.RunNext());  // a: now a then b
  got.clear();
  e.TakeFinished(&got);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].job_id, a);
  EXPECT_EQ(got[1].job_id, b);
  for (const TransferResult& r : got) {
    EXPECT_TRUE(r.success);
    EXPECT_EQ(r.bytes, 64u);
  }
  EXPECT_EQ(0, std::memcmp(dst.data(), src.data(), dst.size()));
  got.clear();
  e.TakeFinished(&got);
  EXPECT_TRUE(got.empty()) << "a result returned twice";
  EXPECT_EQ(e.Wait(a).code(), StatusCode::kNotFound);
  e.Drain();  // nothing pending: returns at once
}

}  // namespace
}  // namespace kvo
