// FakeJobs<Job, Result>: the job contract (transfer/job.h: submit, take finished, drain) as a test
// double. Submitted jobs are recorded and finish only when the test says so (Complete), or at once
// when the test posts a result itself (Post, a synchronous backend); TakeFinished hands results
// back in the order they finished, each exactly once. `Job` has a `job_id` member. Fakes of the
// manager's transports and secondary tiers are built on it (tests/manager/fake_transport.h, ...).
// Not thread-safe: a fake runs on the test's thread.
#pragma once

#include <algorithm>
#include <utility>
#include <vector>

#include "transfer/job.h"

namespace kvo::testing {

template <typename Job, typename Result>
class FakeJobs {
 public:
  void Submit(const Job& job) { submitted.push_back(job); }

  // The submitted (unfinished) job `id`, or null.
  const Job* Find(JobId id) const {
    auto it = std::find_if(submitted.begin(), submitted.end(),
                           [&](const Job& j) { return j.job_id == id; });
    return it == submitted.end() ? nullptr : &*it;
  }

  // Finishes the submitted job `id` with `result`; false (no change) when no such job is pending.
  bool Complete(JobId id, Result result) {
    auto it = std::find_if(submitted.begin(), submitted.end(),
                           [&](const Job& j) { return j.job_id == id; });
    if (it == submitted.end()) return false;
    submitted.erase(it);
    finished.push_back(std::move(result));
    return true;
  }

  // A result that did not go through Submit (a backend that finishes jobs synchronously).
  void Post(Result result) { finished.push_back(std::move(result)); }

  void TakeFinished(std::vector<Result>* out) {
    for (Result& r : finished) out->push_back(std::move(r));
    finished.clear();
  }

  // Jobs in flight and results not taken vanish (a crash of the backend).
  void Lose() {
    submitted.clear();
    finished.clear();
  }

  std::vector<Job> submitted;  // in flight, in submission order
  std::vector<Result> finished;
};

}  // namespace kvo::testing
