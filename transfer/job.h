// The job contract (transfer/DESIGN.md "The job contract"): every asynchronous backend of kvo —
// the transfer engines (host, CUDA), the file block store, the manager's tier transports and
// secondary tiers — is driven by the same three verbs:
//
//   Submit*(...)         validates and queues a job, returns its JobId at once (errors: no job);
//   TakeFinished(out)    appends the results of finished jobs, each exactly once;
//   Drain()              blocks until every submitted job finished (results stay queued).
//
// (plus Wait(job) where a backend can wait for one job.) The shared pieces here: the id, the
// per-block result, the job result fields every backend reports, and the in-order-per-lane
// completion queue the transfer engines share.
//
// Not thread-safe by itself: InOrderJobQueue is guarded by its owner's mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>

#include "common/status.h"

namespace kvo {

// A job's id, unique per backend instance, never 0.
using JobId = uint64_t;

// One block of a job: what happened to it (ok or why not), bytes moved, seconds it took (0 when
// the backend does not time blocks). Backends add their own detail by deriving (FsBlockResult).
struct BlockResult {
  Status status;
  uint64_t bytes = 0;
  double seconds = 0;
};

// The fields every job result carries (vLLM's TransferResult(job_id, success, transfer_size,
// transfer_time) plus the failure's Status). Backends derive their result from it, adding the
// direction and, where they have them, per-block results (TransferResult, FsJobResult).
struct JobResultFields {
  JobId job_id = 0;
  bool success = false;
  uint64_t bytes = 0;  // bytes the job moved
  double seconds = 0;  // start (or submit) to end of the job
  Status status;       // non-ok when !success and the backend has one cause to report
};

// Completion in submission order per lane (a direction): jobs are pushed on their lane at Submit;
// TakeFinished pops, lane by lane, the finished prefix and stops at the first unfinished job of
// each lane (vLLM's FIFO poll of end events); lanes are independent. Whether a job is finished is
// the caller's predicate: the host engine reads a flag its workers set, the CUDA engine queries
// the job's end event. `Job` has a `JobId id` member.
template <typename Job, size_t kLanes>
class InOrderJobQueue {
 public:
  void Push(size_t lane, std::shared_ptr<Job> job) { lanes_[lane].push_back(std::move(job)); }

  // Pops each lane's finished prefix in order, handing every popped job to `take(job)`.
  // `finished(job)` is asked for a lane's front only.
  template <typename Finished, typename Take>
  void TakeFinished(Finished&& finished, Take&& take) {
    for (auto& lane : lanes_) {
      while (!lane.empty() && finished(*lane.front())) {
        std::shared_ptr<Job> job = std::move(lane.front());
        lane.pop_front();
        take(job);
      }
    }
  }

  // The queued job `id`, or null when it was never pushed or was already taken.
  std::shared_ptr<Job> Find(JobId id) const {
    for (const auto& lane : lanes_) {
      for (const auto& j : lane) {
        if (j->id == id) return j;
      }
    }
    return nullptr;
  }

  // Whether `id` and every job before it on its lane are finished; nullopt when `id` is not
  // queued.
  template <typename Finished>
  std::optional<bool> FinishedThrough(JobId id, Finished&& finished) const {
    for (const auto& lane : lanes_) {
      bool prefix_done = true;
      for (const auto& j : lane) {
        prefix_done = prefix_done && finished(*j);
        if (j->id == id) return prefix_done;
      }
    }
    return std::nullopt;
  }

  // Whether every queued job is finished.
  template <typename Finished>
  bool AllFinished(Finished&& finished) const {
    for (const auto& lane : lanes_) {
      for (const auto& j : lane) {
        if (!finished(*j)) return false;
      }
    }
    return true;
  }

  // Calls `fn(job)` for every queued job, lane by lane in order.
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (const auto& lane : lanes_) {
      for (const auto& j : lane) fn(*j);
    }
  }

  bool empty() const {
    for (const auto& lane : lanes_) {
      if (!lane.empty()) return false;
    }
    return true;
  }

 private:
  std::deque<std::shared_ptr<Job>> lanes_[kLanes];
};

}  // namespace kvo
