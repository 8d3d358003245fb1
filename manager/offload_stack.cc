#include "manager/offload_stack.h"

#include <string>
#include <utility>

#include "common/logging.h"
#include "manager/fs_transport.h"
#include "manager/indexed_tier.h"

namespace kvo {
namespace {

Result<ManagerOptions> StackManagerOptions(const OffloadStackOptions& o) {
  const OffloadConfig& c = o.config;
  const OffloadGeometry& g = o.geometry;
  if (g.num_blocks == 0 || g.row_bytes == 0) {
    return Status::InvalidArgument(
        "offload stack: the geometry gives no CPU blocks (cpu_bytes_to_use " +
        std::to_string(c.cpu_bytes_to_use) + ", row of " + std::to_string(g.row_bytes) + " bytes)");
  }
  if (o.cpu_rows.row_stride != g.row_bytes || o.cpu_rows.num_slots < g.num_blocks) {
    return Status::InvalidArgument(
        "offload stack: the CPU rows (" + std::to_string(o.cpu_rows.num_slots) + " of " +
        std::to_string(o.cpu_rows.row_stride) + " bytes) do not hold the geometry's " +
        std::to_string(g.num_blocks) + " rows of " + std::to_string(g.row_bytes) + " bytes");
  }
  ManagerOptions m = o.manager;
  m.num_blocks = g.num_blocks;
  m.eviction_policy = c.eviction_policy;
  m.policy_factory = nullptr;
  m.store_threshold = c.store_threshold;
  m.max_tracker_size = static_cast<size_t>(c.max_tracker_size);
  m.enable_events = o.enable_kv_cache_events;
  m.self_describing_events = c.self_describing_kv_events;
  // A fresh start announces what the file tiers already hold (RecoverOffloadManager reconciles
  // against its journal instead), so every block on disk is announced once.
  m.announce_held_blocks = o.enable_kv_cache_events;
  m.secondary_tiers.clear();
  if (c.spec != OffloadSpec::kTiering) return m;  // vLLM ignores secondary_tiers then

  for (size_t i = 0; i < c.secondary_tiers.size(); ++i) {
    const SecondaryTierConfig& t = c.secondary_tiers[i];
    const std::string where = "secondary_tiers[" + std::to_string(i) + "]";
    if (t.type != "fs") {
      return Status::InvalidArgument(where + ": tier type '" + t.type +
                                     "' is not implemented by kvo (supported: fs)");
    }
    KVO_ASSIGN_OR_RETURN(
        std::shared_ptr<SecondaryTier> tier,
        BuildFsTier(t.fs, o.run, o.rank, g, o.cpu_rows, o.enable_kv_cache_events, where));
    m.secondary_tiers.push_back(std::move(tier));
  }
  return m;
}

}  // namespace

Result<std::shared_ptr<SecondaryTier>> BuildFsTier(const FsTierConfig& fs, const FsRunFields& run,
                                                   uint32_t rank, const OffloadGeometry& g,
                                                   const HostRegion& cpu_rows,
                                                   bool enable_kv_cache_events,
                                                   const std::string& where) {
  FsBlockStoreOptions fo;
  fo.root_dir = fs.root_dir;
  fo.fields = run;
  fo.fields.blocks_per_file = static_cast<uint32_t>(g.blocks_per_chunk);
  // vLLM's FileMapper: a parallelism-agnostic (or replicated) layout collapses the rank to 0, so
  // every rank shares one directory; otherwise each rank has its own <ns>_r<rank>.
  fo.rank = run.parallel_agnostic ? 0 : rank;
  // Range-checked before the narrowing casts (2^32 would become 0); the parser caps them too.
  for (const auto& [name, n] :
       {std::pair<const char*, int64_t>{"n_read_threads", fs.n_read_threads},
        {"n_write_threads", fs.n_write_threads}}) {
    if (n < 0 || n > kFsMaxThreadsPerPool) {
      return Status::InvalidArgument(where + "." + name + " must be 0.." +
                                     std::to_string(kFsMaxThreadsPerPool) + ", got " +
                                     std::to_string(n));
    }
  }
  fo.n_read_threads = static_cast<int>(fs.n_read_threads);
  fo.n_write_threads = static_cast<int>(fs.n_write_threads);
  Result<std::shared_ptr<FsTransport>> transport = FsTransport::Create(fo, cpu_rows);
  if (!transport.ok()) {
    return Status(transport.status().code(),
                  where + " (root_dir '" + fs.root_dir + "'): " + transport.status().message());
  }
  IndexedTierOptions to;
  to.name = "fs";
  if (fs.locality) to.locality = std::string(TierLocalityName(*fs.locality));
  to.enable_kv_events = fs.enable_kv_events && enable_kv_cache_events;
  if (fs.enable_kv_events && !enable_kv_cache_events) {
    KVO_LOG_WARN(
        "{}: enable_kv_events is set but KV cache events are disabled globally; the tier "
        "publishes nothing",
        where);
  }
  to.max_bytes = fs.max_bytes;
  to.block_bytes = g.row_bytes;
  to.async_lookup = true;  // vLLM's FS tier checks files on its pool: RETRY, then the verdict
  Result<std::unique_ptr<IndexedTier>> tier = IndexedTier::Create(to, *std::move(transport));
  if (!tier.ok()) {
    return Status(tier.status().code(), where + ": " + tier.status().message());
  }
  return std::shared_ptr<SecondaryTier>(std::move(tier).value());
}

Result<std::unique_ptr<OffloadManager>> BuildOffloadManager(const OffloadStackOptions& options) {
  KVO_ASSIGN_OR_RETURN(ManagerOptions m, StackManagerOptions(options));
  return OffloadManager::Create(std::move(m));
}

Result<std::unique_ptr<OffloadManager>> RecoverOffloadManager(const OffloadStackOptions& options,
                                                              Journal& journal) {
  KVO_ASSIGN_OR_RETURN(ManagerOptions m, StackManagerOptions(options));
  return OffloadManager::Recover(std::move(m), journal);
}

}  // namespace kvo
