// OffloadStack: an OffloadManager assembled from what a vLLM user configures — the parsed
// `kv_connector_extra_config` (manager/config.h) and the geometry it implies — over the engine's
// CPU rows:
//   CPU tier      geometry.num_blocks slots, eviction_policy, store_threshold / max_tracker_size,
//                 events when the global enable_kv_cache_events is on, self-describing form when
//                 self_describing_kv_events is set
//   secondary     (TieringOffloadingSpec only; vLLM ignores the list for the CPU spec) each `fs`
//                 entry in order: an IndexedTier over the file tier (FsTransport) in vLLM's layout
//                 under root_dir, with its read/write thread counts, locality, vLLM's asynchronous
//                 lookup (RETRY, then the verdict after the step), events when the tier's
//                 enable_kv_events and the global flag are both on (vLLM warns and emits nothing
//                 otherwise), and kvo's max_bytes bound (0: unbounded, as vLLM)
// Errors name what does not fit (rows smaller than the geometry, an unknown tier type, a file
// tier that cannot open its root). Thread-compatible (the manager's rule).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "common/clock.h"
#include "common/result.h"
#include "events/journal.h"
#include "events/zmq_publisher.h"
#include "manager/config.h"
#include "manager/offload_manager.h"
#include "manager/secondary_tier.h"
#include "transfer/fs_namespace.h"
#include "transfer/kv_layout.h"

namespace kvo {

struct OffloadStackOptions {
  OffloadConfig config;      // ParseOffloadConfig
  OffloadGeometry geometry;  // ComputeOffloadGeometry(config, the engine's KvGeometry)
  // The CPU tier's rows: at least geometry.num_blocks of geometry.row_bytes each (pinned memory in
  // an engine; any host memory here).
  HostRegion cpu_rows;
  // The run identity the file tier's directory digest is computed from (model, dtype, groups,
  // parallelism); blocks_per_file is taken from the geometry.
  FsRunFields run;
  // This process's rank (vLLM's parallel.rank): the file tiers' directory is <namespace>_r<rank>,
  // rank 0 whatever this is when run.parallel_agnostic (vLLM's FileMapper rule).
  uint32_t rank = 0;
  bool enable_kv_cache_events = false;  // the global --kv-events-config flag
  // The manager's options as the caller sets them (publisher, journal, clock, data_parallel_rank,
  // track_blocks, ...). The builder overwrites what the config and geometry decide: num_blocks,
  // eviction_policy (policy_factory cleared), store_threshold, max_tracker_size, enable_events
  // and announce_held_blocks (enable_kv_cache_events), self_describing_events and secondary_tiers.
  ManagerOptions manager;
};

// One `fs` secondary tier as the stack builds it (also used alone: kvo.vllm.KvoFsTier under vLLM's
// own CPU tier). `where` prefixes errors (e.g. "secondary_tiers[0]"). `rank` as
// OffloadStackOptions::rank (0 when run.parallel_agnostic).
Result<std::shared_ptr<SecondaryTier>> BuildFsTier(const FsTierConfig& fs, const FsRunFields& run,
                                                   uint32_t rank, const OffloadGeometry& geometry,
                                                   const HostRegion& cpu_rows,
                                                   bool enable_kv_cache_events,
                                                   const std::string& where);

// A fresh manager: the file tiers index what their directories already hold and, with events on,
// the first TakeEvents / PublishEvents announces it (ManagerOptions.announce_held_blocks). For a
// process whose journal already holds this stream's history use RecoverOffloadManager instead.
Result<std::unique_ptr<OffloadManager>> BuildOffloadManager(const OffloadStackOptions& options);
// After a restart: the same stack, then OffloadManager::Recover from `journal` (CPU blocks
// announced removed, file tiers reconciled with their directories).
Result<std::unique_ptr<OffloadManager>> RecoverOffloadManager(const OffloadStackOptions& options,
                                                              Journal& journal);

}  // namespace kvo
