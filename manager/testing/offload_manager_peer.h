// OffloadManagerPeer: what tests (and the Python bindings' test helpers) look at inside an
// OffloadManager, kept out of its public header. Not for production code: nothing here is part
// of the manager's contract. Thread-compatible (the manager's rule).
#pragma once

#include "common/status.h"
#include "manager/cache_policy.h"
#include "manager/offload_manager.h"

namespace kvo {

class OffloadManagerPeer {
 public:
  // Cross-checks the CPU tier's slot table, counters and policy (Internal when broken).
  static Status CheckInvariants(const OffloadManager& m);
  // The CPU tier's policy (e.g. a test reading ARC's lists).
  static CachePolicy& CpuPolicy(OffloadManager& m);
};

}  // namespace kvo
