#include "sim/engine.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <list>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "common/file_system.h"
#include "common/hex.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/mutex.h"
#include "events/events.h"
#include "manager/metrics.h"
#include "manager/offload_stack.h"
#include "manager/secondary_tier.h"
#include "transfer/transfer_engine.h"

namespace kvo::sim {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  uint64_t z = x;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

using SteadyClock = std::chrono::steady_clock;
double Since(SteadyClock::time_point t0) {
  return std::chrono::duration<double>(SteadyClock::now() - t0).count();
}

}  // namespace

const char* MediumName(int m) {
  static const char* kNames[] = {"GPU", "CPU", "DISK"};
  return m >= 0 && m < kNumMedia ? kNames[m] : "?";
}

std::string HashHex(uint64_t h) { return HexU64(h); }

std::string SetDigest(const std::vector<uint64_t>& hashes) {
  uint64_t sum = 0;
  for (uint64_t h : hashes) sum += SplitMix64(h);
  return HashHex(sum);
}

void FillLayer(uint64_t wire, int layer, uint8_t* p, uint64_t bytes) {
  uint64_t x = SplitMix64(wire ^ (0x6c8e9cf570932bd5ULL * static_cast<uint64_t>(layer + 1)));
  uint64_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    x += 0x9e3779b97f4a7c15ULL;
    uint64_t z = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    std::memcpy(p + i, &z, 8);
  }
  for (; i < bytes; ++i) p[i] = static_cast<uint8_t>(x >> (8 * (i & 7)));
}

namespace {

// Forwards to the real publisher and counts what it publishes in the indexer's unit: block
// hashes (BlockStored / BlockRemoved) plus one per AllBlocksCleared, whoever publishes (the GPU
// cache here or the offload manager), so "published" and "indexed" compare one to one.
class CountingPublisher final : public EventPublisher {
 public:
  explicit CountingPublisher(std::unique_ptr<EventPublisher> inner) : inner_(std::move(inner)) {}
  Status Publish(EventBatch batch) override {
    uint64_t n = 0;
    for (const KvEvent& e : batch.events) {
      if (auto* st = std::get_if<BlockStored>(&e)) n += st->block_hashes.size();
      if (auto* r = std::get_if<BlockRemoved>(&e)) n += r->block_hashes.size();
      if (std::holds_alternative<AllBlocksCleared>(e)) ++n;
    }
    Status status = inner_->Publish(std::move(batch));
    if (status.ok()) published_.fetch_add(n, std::memory_order_relaxed);
    return status;
  }
  void Flush() override { inner_->Flush(); }
  void Shutdown() override { inner_->Shutdown(); }
  std::optional<KvEventsConfig> publisher_config() const override {
    return inner_->publisher_config();
  }
  PublisherStats stats() const override { return inner_->stats(); }
  uint64_t block_events_published() const { return published_.load(std::memory_order_relaxed); }

 private:
  std::unique_ptr<EventPublisher> inner_;
  std::atomic<uint64_t> published_{0};
};

}  // namespace

struct SimEngine::Impl {
  SimEngineOptions opt;
  uint64_t block_bytes = 0;
  BlockHashOptions hash;
  OffloadConfig config;
  OffloadGeometry geometry;
  std::unique_ptr<TransferEngine> transfer;  // owns the CPU rows
  HostRegion rows;
  std::vector<uint8_t> gpu_mem;
  std::vector<uint8_t> scratch;  // one block's expected bytes
  std::unique_ptr<Journal> journal;
  std::unique_ptr<CountingPublisher> publisher;
  std::unique_ptr<OffloadManager> manager;
  MetricsRegistry metrics;
  std::unique_ptr<OffloadMetricsExporter> exporter;
  std::vector<TransferResult> finished;
  // GPU prefix cache: wire hash -> (block id, position in the LRU list); free ids.
  std::list<uint64_t> lru;
  std::unordered_map<uint64_t, std::pair<uint32_t, std::list<uint64_t>::iterator>> gpu;
  std::vector<uint32_t> free_ids;
  Mutex mu;
  EngineCounters counters;
  uint64_t stored_events_storage_seen = 0;

  OffloadStackOptions StackOptions() const {
    OffloadStackOptions o;
    o.config = config;
    o.geometry = geometry;
    o.cpu_rows = rows;
    o.run.model_name = opt.model;
    o.run.tokens_per_hash = static_cast<uint32_t>(opt.block_size);
    o.enable_kv_cache_events = opt.events.enable_kv_cache_events;
    o.manager.publisher = publisher.get();
    o.manager.track_blocks = true;
    return o;
  }

  uint8_t* GpuPtr(uint32_t id) { return gpu_mem.data() + uint64_t{id} * block_bytes; }
  uintptr_t Gpu(uint32_t id) { return reinterpret_cast<uintptr_t>(GpuPtr(id)); }
  uintptr_t Row(int32_t slot) const {
    return rows.base + static_cast<uint64_t>(slot) * rows.row_stride;
  }

  void Prefill(uint64_t wire, uint8_t* p) {
    const uint64_t seg = block_bytes / static_cast<uint64_t>(opt.num_layers);
    for (int l = 0; l < opt.num_layers; ++l) {
      const uint64_t n = l + 1 == opt.num_layers ? block_bytes - seg * uint64_t(l) : seg;
      FillLayer(wire, l, p + seg * uint64_t(l), n);
    }
  }
  bool Verify(uint64_t wire, const uint8_t* p) {
    Prefill(wire, scratch.data());
    return std::memcmp(scratch.data(), p, block_bytes) == 0;
  }

  void DrainTiers() EXCLUSIVE_LOCKS_REQUIRED(mu) {
    for (size_t t = 0; t < manager->num_secondary_tiers(); ++t) {
      manager->secondary_tier(t).Drain();
    }
  }

  // One scheduler step: finished tier jobs, new promotions and cascades, the step's events.
  // `drain`: wait for the file tier's jobs first (quiesce).
  // With synchronous_steps every step drains, after OnScheduleEnd: what the step submitted too.
  Status EndStep(bool drain) EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (drain && !opt.synchronous_steps) DrainTiers();
    manager->OnScheduleEnd();
    if (opt.synchronous_steps) DrainTiers();
    KVO_RETURN_IF_ERROR(manager->PublishEvents());
    // Blocks the file tier announced stored (its cascade writes).
    const uint64_t storage_stored = manager->GetStats().events_taken.blocks[1][0];
    counters.bytes_stored[kDisk] += (storage_stored - stored_events_storage_seen) * block_bytes;
    stored_events_storage_seen = storage_stored;
    return exporter->Export(manager->GetStats());
  }
  // Until nothing is in flight (bounded: a job that never ends is the tier's bug).
  Status Quiesce() EXCLUSIVE_LOCKS_REQUIRED(mu) {
    for (int i = 0; i < 16; ++i) {
      KVO_RETURN_IF_ERROR(EndStep(true));
      if (!manager->HasPendingWork()) break;
    }
    return Status::Ok();
  }

  // The engine's step loop between requests: collects finished file-tier jobs and publishes
  // their events while no request is being served (a real engine steps continuously).
  std::thread stepper;
  std::mutex stop_mu;
  std::condition_variable stop_cv;
  bool stop = false;
  void StepLoop() {
    std::unique_lock<std::mutex> lock(stop_mu);
    while (!stop_cv.wait_for(lock, std::chrono::milliseconds(5), [&] { return stop; })) {
      MutexLock engine_lock(&mu);
      if (!manager->HasPendingWork()) continue;
      Status s = EndStep(false);
      if (!s.ok()) KVO_LOG_WARN("sim step: {}", s.ToString());
    }
  }

  Status Finish(JobId job) {
    Status s = transfer->Wait(job);
    finished.clear();
    transfer->TakeFinished(&finished);
    for (const TransferResult& r : finished) exporter->RecordTransfer(r);
    return s;
  }

  uint64_t DiskHits() const {
    const ManagerStats s = manager->GetStats();
    return s.tiers.size() > 1 ? s.tiers[1].block_hits : 0;
  }

  uint32_t Touch(uint64_t wire) {
    auto it = gpu.find(wire);
    lru.splice(lru.end(), lru, it->second.second);
    return it->second.first;
  }

  uint32_t Place(uint64_t wire, uint32_t id) {
    lru.push_back(wire);
    gpu[wire] = {id, std::prev(lru.end())};
    return id;
  }

  // A free GPU block for `wire`, else the least recently used block this request does not use
  // (BlockRemoved GPU for it, as vLLM's block pool when a cached block is reused).
  Result<uint32_t> AllocateGpu(uint64_t wire, const std::vector<uint64_t>& request,
                               EventBatch* events) {
    if (!free_ids.empty()) {
      uint32_t id = free_ids.back();
      free_ids.pop_back();
      return Place(wire, id);
    }
    for (auto it = lru.begin(); it != lru.end(); ++it) {
      const uint64_t victim = *it;
      if (std::find(request.begin(), request.end(), victim) != request.end()) continue;
      const uint32_t id = gpu[victim].first;
      gpu.erase(victim);
      lru.erase(it);
      BlockRemoved r;
      r.block_hashes = {BlockHash::Uint(victim)};
      r.medium = kMediumGpu;
      r.group_idx = 0;
      events->events.push_back(std::move(r));
      return Place(wire, id);
    }
    return Status::OutOfSpace("a request of " + std::to_string(request.size()) +
                              " blocks does not fit the GPU cache of " +
                              std::to_string(opt.gpu_blocks) + " blocks");
  }

  Status Publish(EventBatch batch) {
    if (batch.events.empty()) return Status::Ok();
    return publisher->Publish(std::move(batch));
  }

  Result<ServeResult> Serve(const std::vector<uint32_t>& prompt, const std::string& req_id)
      EXCLUSIVE_LOCKS_REQUIRED(mu);
};

Result<ServeResult> SimEngine::Impl::Serve(const std::vector<uint32_t>& prompt,
                                           const std::string& req_id) {
  ServeResult out;
  out.prompt_tokens = prompt.size();
  std::vector<int64_t> tokens(prompt.begin(), prompt.end());
  KVO_ASSIGN_OR_RETURN(std::vector<uint64_t> wires, HashBlocksWire(tokens, hash));
  const size_t n = wires.size();
  // As vLLM: at most prompt_len - 1 tokens come from the cache (the last token is computed).
  const size_t max_hit = prompt.empty() ? 0 : (prompt.size() - 1) / size_t(opt.block_size);
  std::vector<OffloadKey> keys;
  keys.reserve(n);
  for (uint64_t w : wires) keys.push_back(OffloadKey::FromWireHash(w, 0));
  RequestContext ctx;
  ctx.req_id = req_id;
  (void)manager->OnNewRequest(ctx);

  // 1. The GPU prefix cache.
  size_t gpu_hit = 0;
  while (gpu_hit < max_hit && gpu.count(wires[gpu_hit])) ++gpu_hit;

  // 2. The offload tiers (deferred while a file check or promotion runs: the next step).
  const auto t_load = SteadyClock::now();
  std::span<const OffloadKey> rest(keys.data() + gpu_hit, max_hit - gpu_hit);
  const uint64_t disk_before = DiskHits();
  OffloadManager::PrefixLookupResult hit;
  // A deferred lookup waits for the file tier's answer as vLLM's scheduler does, retrying each
  // step; steps here are 100 us apart, and after 200 of them a step waits for the tier's jobs.
  // With synchronous_steps every step waits for the tier's jobs.
  for (int step = 0;; ++step) {
    hit = manager->MaximalPrefixLookup(rest, ctx);
    manager->Touch(rest, ctx);
    if (!hit.deferred) break;
    if (step == 250) return Status::Internal(req_id + ": lookup still deferred after 250 steps");
    ++counters.deferred_steps;
    const bool drain = opt.synchronous_steps || step >= 200;
    KVO_RETURN_IF_ERROR(EndStep(drain));
    if (!drain) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  const size_t offload_hit = hit.hits;
  const size_t disk_hit = std::min<uint64_t>(DiskHits() - disk_before, offload_hit);
  const size_t cpu_hit = offload_hit - disk_hit;

  // 3. GPU blocks for everything past the GPU hit.
  std::vector<uint32_t> ids(n);
  std::vector<bool> placed(n, false);
  for (size_t i = 0; i < gpu_hit; ++i) ids[i] = Touch(wires[i]);
  EventBatch gpu_events{NowSeconds(), {}, std::nullopt};
  for (size_t i = gpu_hit; i < n; ++i) {
    if (gpu.count(wires[i])) {
      ids[i] = Touch(wires[i]);
      continue;
    }
    KVO_ASSIGN_OR_RETURN(ids[i], AllocateGpu(wires[i], wires, &gpu_events));
    placed[i] = true;
  }

  // 4. Load the offloaded hits into their GPU blocks and check every byte.
  if (offload_hit > 0) {
    std::span<const OffloadKey> load(keys.data() + gpu_hit, offload_hit);
    KVO_ASSIGN_OR_RETURN(std::vector<int32_t> slots, manager->PrepareLoad(load, ctx));
    TransferRequest req;
    req.direction = TransferDirection::kCpuToGpu;
    for (size_t j = 0; j < slots.size(); ++j) {
      req.segments.push_back({Row(slots[j]), Gpu(ids[gpu_hit + j]), block_bytes});
    }
    KVO_ASSIGN_OR_RETURN(JobId job, transfer->Submit(std::move(req)));
    KVO_RETURN_IF_ERROR(Finish(job));
    for (size_t j = 0; j < slots.size(); ++j) {
      const size_t i = gpu_hit + j;
      if (Verify(wires[i], GpuPtr(ids[i]))) {
        ++out.blocks_verified;
      } else {
        ++out.mismatches;
        KVO_LOG_ERROR("{}: block {} loaded from the offload tiers has the wrong bytes", req_id,
                      HashHex(wires[i]));
        Prefill(wires[i], GpuPtr(ids[i]));  // recomputed
      }
    }
    KVO_RETURN_IF_ERROR(manager->CompleteLoad(load, ctx));
  }
  out.load_seconds = offload_hit > 0 || manager->num_secondary_tiers() > 0 ? Since(t_load) : 0;
  out.bytes_loaded[kCpu] = cpu_hit * block_bytes;
  out.bytes_loaded[kDisk] = disk_hit * block_bytes;

  // 5. Prefill the rest (its bytes).
  const size_t first_computed = gpu_hit + offload_hit;
  for (size_t i = first_computed; i < n; ++i) Prefill(wires[i], GpuPtr(ids[i]));
  out.hit_tokens[kGpu] = gpu_hit * size_t(opt.block_size);
  out.hit_tokens[kCpu] = cpu_hit * size_t(opt.block_size);
  out.hit_tokens[kDisk] = disk_hit * size_t(opt.block_size);
  out.computed_tokens = prompt.size() - first_computed * size_t(opt.block_size);

  // 6. BlockStored GPU for the newly full blocks, one event per run, chained to its parent.
  for (size_t first = gpu_hit; first < n;) {
    if (!placed[first]) {
      ++first;
      continue;
    }
    size_t end = first;
    while (end < n && placed[end]) ++end;
    BlockStored st;
    for (size_t i = first; i < end; ++i) st.block_hashes.push_back(BlockHash::Uint(wires[i]));
    if (first > 0) st.parent_block_hash = BlockHash::Uint(wires[first - 1]);
    st.token_ids.assign(tokens.begin() + static_cast<long>(first * size_t(opt.block_size)),
                        tokens.begin() + static_cast<long>(end * size_t(opt.block_size)));
    st.block_size = opt.block_size;
    st.medium = kMediumGpu;
    st.group_idx = 0;
    st.kv_cache_spec_kind = "full_attention";
    gpu_events.events.push_back(std::move(st));
    first = end;
  }
  KVO_RETURN_IF_ERROR(Publish(std::move(gpu_events)));

  // 7. Offload the computed blocks GPU -> CPU (the cascade to the file tier follows).
  if (first_computed < n) {
    const auto t_store = SteadyClock::now();
    std::span<const OffloadKey> store(keys.data() + first_computed, n - first_computed);
    KVO_ASSIGN_OR_RETURN(std::optional<PrepareStoreOutput> ps, manager->PrepareStore(store, ctx));
    if (ps.has_value() && !ps->keys_to_store.empty()) {
      TransferRequest req;
      req.direction = TransferDirection::kGpuToCpu;
      for (size_t j = 0; j < ps->keys_to_store.size(); ++j) {
        const auto it = std::find(keys.begin(), keys.end(), ps->keys_to_store[j]);
        req.segments.push_back(
            {Gpu(ids[static_cast<size_t>(it - keys.begin())]), Row(ps->slots[j]), block_bytes});
      }
      KVO_ASSIGN_OR_RETURN(JobId job, transfer->Submit(std::move(req)));
      const Status copied = Finish(job);
      KVO_RETURN_IF_ERROR(manager->CompleteStore(ps->keys_to_store, ctx, copied.ok()));
      KVO_RETURN_IF_ERROR(copied);
      counters.bytes_stored[kCpu] += ps->keys_to_store.size() * block_bytes;
    }
    out.store_seconds = Since(t_store);
  }
  manager->Touch(keys, ctx);
  manager->OnRequestFinished(ctx);
  // The cascade's file writes go on in the background (unless synchronous_steps).
  KVO_RETURN_IF_ERROR(EndStep(opt.synchronous_steps));
  return out;
}

SimEngine::SimEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

SimEngine::~SimEngine() {
  if (!impl_) return;
  if (impl_->stepper.joinable()) {
    {
      std::lock_guard<std::mutex> lock(impl_->stop_mu);
      impl_->stop = true;
    }
    impl_->stop_cv.notify_all();
    impl_->stepper.join();
  }
  {
    MutexLock lock(&impl_->mu);
    Status s = impl_->Quiesce();
    if (!s.ok()) KVO_LOG_WARN("sim shutdown: {}", s.ToString());
  }
  if (impl_->publisher) impl_->publisher->Shutdown();
}

Result<std::unique_ptr<SimEngine>> SimEngine::Open(const SimEngineOptions& options) {
  auto impl = std::make_unique<Impl>();
  Impl& e = *impl;
  e.opt = options;
  if (options.block_size < 1) return Status::InvalidArgument("--block-size must be positive");
  if (options.gpu_blocks < 1) return Status::InvalidArgument("--gpu-blocks must be positive");
  if (options.num_layers < 1) return Status::InvalidArgument("--num-layers must be positive");
  e.block_bytes = options.bytes_per_token * uint64_t(options.block_size);
  if (e.block_bytes < uint64_t(options.num_layers) || e.block_bytes > (64u << 20)) {
    return Status::InvalidArgument(
        "--bytes-per-token: a block of " + std::to_string(e.block_bytes) +
        " bytes must hold at least one byte per layer and at most 64 MiB");
  }
  e.hash.algo = options.hash_algo;
  e.hash.none_hash = NoneHash(options.hash_algo, options.hash_seed);
  e.hash.block_size = size_t(options.block_size);

  KvGeometry kv;
  kv.worker_kv_bytes_per_block = e.block_bytes;
  kv.gpu_block_size = uint64_t(options.block_size);
  kv.tokens_per_hash = uint64_t(options.block_size);
  auto config = ParseOffloadConfig(options.kv_transfer_config, kv);
  if (!config.ok()) {
    return Status::InvalidArgument("--kv-transfer-config: " + config.status().message());
  }
  e.config = *config;
  auto geometry = ComputeOffloadGeometry(e.config, kv);
  if (!geometry.ok()) {
    return Status::InvalidArgument("--kv-transfer-config: " + geometry.status().message());
  }
  e.geometry = *geometry;
  if (e.geometry.blocks_per_chunk != 1) {
    return Status::InvalidArgument(
        "--kv-transfer-config: kvo sim offloads one GPU block per chunk; set block_size to "
        "--block-size (" +
        std::to_string(options.block_size) + ")");
  }
  if (e.geometry.num_blocks == 0) {
    return Status::InvalidArgument("--kv-transfer-config: cpu_bytes_to_use holds no block of " +
                                   std::to_string(e.geometry.row_bytes) + " bytes");
  }
  TransferEngineOptions to;
  to.num_threads = 2;
  KVO_ASSIGN_OR_RETURN(e.transfer, MakeTransferEngine("host", to));
  KVO_ASSIGN_OR_RETURN(e.rows,
                       e.transfer->AllocateHostRegion(e.geometry.num_blocks, e.geometry.row_bytes));
  e.gpu_mem.assign(options.gpu_blocks * e.block_bytes, 0);
  e.scratch.resize(e.block_bytes);
  for (size_t i = options.gpu_blocks; i > 0; --i) e.free_ids.push_back(uint32_t(i - 1));
  e.counters.gpu_blocks_total = options.gpu_blocks;

  JournalOptions jo;
  jo.dir = options.workdir + "/journal";
  KVO_ASSIGN_OR_RETURN(e.journal, Journal::Open(jo));
  PublisherOptions po;
  po.journal = e.journal.get();
  KVO_ASSIGN_OR_RETURN(std::unique_ptr<EventPublisher> zmq,
                       CreateEventPublisher(options.events, 0, po));
  e.publisher = std::make_unique<CountingPublisher>(std::move(zmq));
  // A journal with history is a restart: reconcile against it (CPU blocks removed, the file tier
  // matched with its directory); else a fresh start announces what the file tier already holds.
  KVO_ASSIGN_OR_RETURN(e.manager, e.journal->empty()
                                      ? BuildOffloadManager(e.StackOptions())
                                      : RecoverOffloadManager(e.StackOptions(), *e.journal));
  OffloadMetricsOptions mo;
  mo.engine_labels = {{"engine", options.instance_id}};
  mo.tiering = e.manager->num_secondary_tiers() > 0;
  KVO_ASSIGN_OR_RETURN(e.exporter, OffloadMetricsExporter::Create(&e.metrics, mo));
  if (!options.synchronous_steps) {
    Impl* raw = impl.get();
    impl->stepper = std::thread([raw] { raw->StepLoop(); });
  }
  return std::unique_ptr<SimEngine>(new SimEngine(std::move(impl)));
}

Result<ServeResult> SimEngine::Serve(const std::vector<uint32_t>& tokens,
                                     const std::string& req_id) {
  MutexLock lock(&impl_->mu);
  KVO_ASSIGN_OR_RETURN(ServeResult r, impl_->Serve(tokens, req_id));
  EngineCounters& c = impl_->counters;
  ++c.requests;
  c.prompt_tokens += r.prompt_tokens;
  c.prefill_tokens_computed += r.computed_tokens;
  for (int m = 0; m < kNumMedia; ++m) {
    c.hit_tokens[m] += r.hit_tokens[m];
    c.bytes_loaded[m] += r.bytes_loaded[m];
  }
  c.load_seconds += r.load_seconds;
  c.store_seconds += r.store_seconds;
  c.blocks_verified += r.blocks_verified;
  c.mismatches += r.mismatches;
  return r;
}

Status SimEngine::ResetPrefixCache() {
  MutexLock lock(&impl_->mu);
  Impl& e = *impl_;
  e.gpu.clear();
  e.lru.clear();
  e.free_ids.clear();
  for (size_t i = e.opt.gpu_blocks; i > 0; --i) e.free_ids.push_back(uint32_t(i - 1));
  ++e.counters.resets;
  EventBatch b{NowSeconds(), {AllBlocksCleared{}}, std::nullopt};
  return e.Publish(std::move(b));
}

Status SimEngine::RestartOffloadManager() {
  MutexLock lock(&impl_->mu);
  Impl& e = *impl_;
  e.manager.reset();
  std::memset(reinterpret_cast<void*>(e.rows.base), 0, e.rows.bytes());
  e.publisher->Flush();
  KVO_ASSIGN_OR_RETURN(e.manager, RecoverOffloadManager(e.StackOptions(), *e.journal));
  e.stored_events_storage_seen = e.manager->GetStats().events_taken.blocks[1][0];
  return Status::Ok();
}

EngineCounters SimEngine::Counters() {
  MutexLock lock(&impl_->mu);
  EngineCounters c = impl_->counters;
  c.cpu_evictions = impl_->manager->GetStats().evictions;
  c.gpu_blocks_used = impl_->gpu.size();
  c.events_published = impl_->publisher->block_events_published();
  return c;
}

EngineState SimEngine::State() {
  {
    MutexLock lock(&impl_->mu);
    Status s = impl_->Quiesce();  // every block's event published before the state is read
    if (!s.ok()) KVO_LOG_WARN("sim state: {}", s.ToString());
  }
  EngineState st;
  st.counters = Counters();
  MutexLock lock(&impl_->mu);
  for (const auto& [wire, v] : impl_->gpu) st.blocks[kGpu].push_back(wire);
  auto snap = impl_->manager->Snapshot();
  if (snap.ok()) {
    for (const auto& [k, count] : snap->cpu_hashes) {
      if (count > 0) st.blocks[kCpu].push_back(k.second);
    }
    for (const auto& [k, count] : snap->storage_hashes) {
      if (count > 0) st.blocks[kDisk].push_back(k.second);
    }
  } else {
    KVO_LOG_WARN("sim state: {}", snap.status().ToString());
  }
  for (auto& v : st.blocks) {
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
  }
  return st;
}

const SimEngineOptions& SimEngine::options() const { return impl_->opt; }

const KvEventsConfig& SimEngine::events_config() const { return impl_->opt.events; }

std::string SimEngine::PrometheusText() { return impl_->metrics.RenderPrometheus(); }

void SimEngine::FlushEvents() { impl_->publisher->Flush(); }

std::optional<uint64_t> SimEngine::NextEventSeq() { return impl_->publisher->stats().next_seq; }

}  // namespace kvo::sim
