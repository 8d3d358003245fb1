// kvo demo, part 2: the whole pipeline on this machine. Two engine instances serve multi-turn
// conversations that share a system prompt. Each has a small "GPU" prefix cache (host memory
// stands in for HBM here; the CUDA engine is tested on a GPU separately) and a kvo offload stack
// built from a vLLM `--kv-transfer-config` (TieringOffloadingSpec: pinned-CPU rows, then a bounded
// file tier). Blocks evicted from the GPU come back from CPU or, promoted, from disk, and every
// byte loaded is checked against what was computed. The GPU prefix-cache events (self-describing,
// real vLLM sha256_cbor hashes) and the offload events (vLLM's placeholder form) go out on each
// engine's journaled ZeroMQ publisher; a kvo indexer subscribed to both answers a router's
// question over HTTP — which instance holds how much of the next prompt, on which tier — and its
// hash-parity doctor checks the engines' hashes. Finally one engine restarts: the manager recovers
// from its journal (CPU gone, files kept) and the indexer follows.
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <list>
#include <memory>
#include <thread>
#include <unordered_map>

#include "common/file_system.h"
#include "events/events.h"
#include "indexer/service/client.h"
#include "indexer/service/service.h"
#include "manager/metrics.h"
#include "manager/offload_stack.h"
#include "manager/secondary_tier.h"
#include "tools/commands.h"
#include "transfer/transfer_engine.h"

namespace kvo::cli {
namespace {

constexpr int64_t kBlockTokens = 16;
constexpr uint64_t kBlockBytes = 32 << 10;  // one block's KV bytes in this toy model
constexpr size_t kGpuBlocks = 64;
constexpr int kConversations = 6;
constexpr int kTurns = 5;
constexpr size_t kSystemBlocks = 8;
constexpr size_t kTurnBlocks = 10;

// The KV bytes a block's prefill computes: a pattern derived from its hash, so a block loaded
// back from any tier can be checked byte for byte.
void FillBlock(uint64_t wire, uint8_t* p) {
  uint64_t x = wire;
  for (uint64_t i = 0; i < kBlockBytes; i += 8) {
    x += 0x9e3779b97f4a7c15ULL;
    uint64_t z = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    std::memcpy(p + i, &z, 8);
  }
}

bool BlockIs(uint64_t wire, const uint8_t* p) {
  std::vector<uint8_t> want(kBlockBytes);
  FillBlock(wire, want.data());
  return std::memcmp(want.data(), p, kBlockBytes) == 0;
}

// vLLM's --kv-transfer-config for one engine.
std::string TransferConfigJson(const std::string& fs_root) {
  return R"({"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
  "kv_connector_extra_config": {
    "spec_name": "TieringOffloadingSpec",
    "cpu_bytes_to_use": )" +
         std::to_string(96 * kBlockBytes) + R"(,
    "eviction_policy": "lru",
    "secondary_tiers": [{"type": "fs", "root_dir": ")" +
         fs_root + R"(", "n_read_threads": 2, "n_write_threads": 2,
                         "enable_kv_events": true, "max_bytes": )" +
         std::to_string(400 * kBlockBytes) + R"(}]}})";
}

struct Counts {
  uint64_t requests = 0, prompt_blocks = 0, gpu_hits = 0, cpu_hits = 0, storage_hits = 0;
  uint64_t computed = 0, deferred_steps = 0, bytes_loaded = 0, bytes_offloaded = 0;
  uint64_t verified = 0;
};

// One engine instance: its GPU prefix cache, its offload stack and its event publisher.
class Engine {
 public:
  static Result<std::unique_ptr<Engine>> Start(const std::string& name, const std::string& dir) {
    auto e = std::unique_ptr<Engine>(new Engine(name, dir));
    KVO_RETURN_IF_ERROR(e->Open());
    return e;
  }

  const std::string& name() const { return name_; }
  const KvEventsConfig& events_config() const { return events_; }
  const Counts& counts() const { return counts_; }
  EventPublisher& publisher() { return *publisher_; }
  OffloadManager& manager() { return *manager_; }
  MetricsRegistry& metrics() { return metrics_; }

  // Serves one request: GPU prefix hit, then the offload tiers, then prefill of the rest; offloads
  // what it computed; publishes the step's events.
  Status Serve(const std::vector<int64_t>& tokens, const std::string& req_id) {
    BlockHashOptions ho;
    ho.algo = HashAlgo::kSha256Cbor;
    ho.none_hash = NoneHash(ho.algo, "0");
    ho.block_size = kBlockTokens;
    KVO_ASSIGN_OR_RETURN(std::vector<std::string> digests, HashBlocks(tokens, ho));
    const size_t n = digests.size();
    std::vector<OffloadKey> keys;
    for (const std::string& d : digests) keys.push_back(OffloadKey::FromDigest(d, 0));
    RequestContext ctx;
    ctx.req_id = req_id;
    (void)manager_->OnNewRequest(ctx);
    ++counts_.requests;
    counts_.prompt_blocks += n;

    // 1. The GPU prefix cache.
    size_t gpu_hit = 0;
    while (gpu_hit < n && gpu_.count(keys[gpu_hit].Wire())) ++gpu_hit;
    counts_.gpu_hits += gpu_hit;

    // 2. The offload tiers (the scheduler's prefix scan; deferred while a file check or a
    // promotion from disk is in flight, as vLLM's scheduler retries next step).
    std::span<const OffloadKey> rest(keys.data() + gpu_hit, n - gpu_hit);
    const uint64_t disk_hits_before = DiskHits();
    OffloadManager::PrefixLookupResult hit;
    for (int step = 0;; ++step) {
      hit = manager_->MaximalPrefixLookup(rest, ctx);
      // As vLLM's scheduler: touch the request's keys on every attempt, so promotions for it do
      // not evict its own blocks.
      manager_->Touch(rest, ctx);
      if (!hit.deferred) break;
      if (step == 20) return Status::Internal(req_id + ": lookup still deferred after 20 steps");
      ++counts_.deferred_steps;
      KVO_RETURN_IF_ERROR(EndStep());
    }
    const uint64_t promoted = DiskHits() - disk_hits_before;
    const size_t offload_hit = hit.hits;
    counts_.storage_hits += std::min<uint64_t>(promoted, offload_hit);
    counts_.cpu_hits += offload_hit - std::min<uint64_t>(promoted, offload_hit);

    // 3. GPU blocks for everything past the GPU hit; this request's blocks are pinned.
    std::vector<uint32_t> gpu_ids(n);
    std::vector<bool> placed(n, false);  // got a GPU block in this request
    for (size_t i = 0; i < gpu_hit; ++i) gpu_ids[i] = Touch(keys[i].Wire());
    EventBatch gpu_events{NowSeconds(), {}, std::nullopt};
    for (size_t i = gpu_hit; i < n; ++i) {
      if (gpu_.count(keys[i].Wire())) {  // cached past the prefix: recomputed in place
        gpu_ids[i] = Touch(keys[i].Wire());
        continue;
      }
      KVO_ASSIGN_OR_RETURN(gpu_ids[i], AllocateGpu(keys[i].Wire(), keys, &gpu_events));
      placed[i] = true;
    }

    // 4. Load the offloaded hits CPU -> GPU and check every byte.
    if (offload_hit > 0) {
      std::span<const OffloadKey> load(keys.data() + gpu_hit, offload_hit);
      KVO_ASSIGN_OR_RETURN(std::vector<int32_t> slots, manager_->PrepareLoad(load, ctx));
      TransferRequest req;
      req.direction = TransferDirection::kCpuToGpu;
      for (size_t j = 0; j < slots.size(); ++j) {
        req.segments.push_back({Row(slots[j]), Gpu(gpu_ids[gpu_hit + j]), kBlockBytes});
      }
      KVO_ASSIGN_OR_RETURN(JobId job, engine_->Submit(std::move(req)));
      KVO_RETURN_IF_ERROR(Finish(job));
      for (size_t j = 0; j < slots.size(); ++j) {
        if (!BlockIs(keys[gpu_hit + j].Wire(), GpuPtr(gpu_ids[gpu_hit + j]))) {
          return Status::Corruption(req_id + ": block " + keys[gpu_hit + j].Hex() +
                                    " loaded from the offload tiers has the wrong bytes");
        }
        ++counts_.verified;
      }
      counts_.bytes_loaded += slots.size() * kBlockBytes;
      KVO_RETURN_IF_ERROR(manager_->CompleteLoad(load, ctx));
    }

    // 5. Prefill the rest.
    const size_t first_computed = gpu_hit + offload_hit;
    for (size_t i = first_computed; i < n; ++i) FillBlock(keys[i].Wire(), GpuPtr(gpu_ids[i]));
    counts_.computed += n - first_computed;

    // 6. The GPU prefix cache announces the blocks it newly holds (vLLM's self-describing GPU
    // events): one BlockStored per run of them, chained to the block before the run.
    for (size_t first = gpu_hit; first < n;) {
      if (!placed[first]) {
        ++first;
        continue;
      }
      size_t end = first;
      while (end < n && placed[end]) ++end;
      BlockStored st;
      for (size_t i = first; i < end; ++i) st.block_hashes.push_back(keys[i].EventHash());
      if (first > 0) st.parent_block_hash = keys[first - 1].EventHash();
      st.token_ids.assign(tokens.begin() + static_cast<long>(first * kBlockTokens),
                          tokens.begin() + static_cast<long>(end * kBlockTokens));
      st.block_size = kBlockTokens;
      st.medium = kMediumGpu;
      st.group_idx = 0;
      st.kv_cache_spec_kind = "full_attention";
      gpu_events.events.push_back(std::move(st));
      first = end;
    }
    KVO_RETURN_IF_ERROR(publisher_->Publish(std::move(gpu_events)));

    // 7. Offload the computed blocks GPU -> CPU (the cascade to disk follows on its own).
    if (first_computed < n) {
      std::span<const OffloadKey> store(keys.data() + first_computed, n - first_computed);
      KVO_ASSIGN_OR_RETURN(std::optional<PrepareStoreOutput> out,
                           manager_->PrepareStore(store, ctx));
      if (out.has_value() && !out->keys_to_store.empty()) {
        TransferRequest req;
        req.direction = TransferDirection::kGpuToCpu;
        for (size_t j = 0; j < out->keys_to_store.size(); ++j) {
          const auto it = std::find(keys.begin(), keys.end(), out->keys_to_store[j]);
          req.segments.push_back({Gpu(gpu_ids[static_cast<size_t>(it - keys.begin())]),
                                  Row(out->slots[j]), kBlockBytes});
        }
        KVO_ASSIGN_OR_RETURN(JobId job, engine_->Submit(std::move(req)));
        const Status copied = Finish(job);
        KVO_RETURN_IF_ERROR(manager_->CompleteStore(out->keys_to_store, ctx, copied.ok()));
        KVO_RETURN_IF_ERROR(copied);
        counts_.bytes_offloaded += out->keys_to_store.size() * kBlockBytes;
      }
    }
    manager_->Touch(keys, ctx);
    manager_->OnRequestFinished(ctx);
    return EndStep();
  }

  // The restart: a new manager recovers from the journal (the CPU rows are gone, the files stay).
  Status Restart() {
    manager_.reset();
    std::memset(reinterpret_cast<void*>(rows_.base), 0, rows_.bytes());
    publisher_->Flush();
    KVO_ASSIGN_OR_RETURN(manager_, RecoverOffloadManager(StackOptions(), *journal_));
    return Status::Ok();
  }

 private:
  Engine(std::string name, std::string dir) : name_(std::move(name)), dir_(std::move(dir)) {}

  Status Open() {
    // The file tier's root_dir holds the engine's KV bytes: private, like the tier's own
    // directories (0700), whatever the umask.
    const std::string fs_root = dir_ + "/fs";
    KVO_RETURN_IF_ERROR(DefaultFileSystem()->CreateDirs(fs_root, FileOptions{}));
    struct stat st {};
    if (::stat(fs_root.c_str(), &st) != 0) return Status::IOError("stat '" + fs_root + "'");
    std::printf("# %s: file tier root_dir %s (mode %04o)\n", name_.c_str(), fs_root.c_str(),
                static_cast<unsigned>(st.st_mode & 07777));
    KvGeometry kv;
    kv.worker_kv_bytes_per_block = kBlockBytes;
    kv.gpu_block_size = kBlockTokens;
    kv.tokens_per_hash = kBlockTokens;
    KVO_ASSIGN_OR_RETURN(config_, ParseOffloadConfig(TransferConfigJson(dir_ + "/fs"), kv));
    KVO_ASSIGN_OR_RETURN(geometry_, ComputeOffloadGeometry(config_, kv));
    TransferEngineOptions to;
    to.num_threads = 2;
    KVO_ASSIGN_OR_RETURN(engine_, MakeTransferEngine("host", to));
    KVO_ASSIGN_OR_RETURN(rows_,
                         engine_->AllocateHostRegion(geometry_.num_blocks, geometry_.row_bytes));
    gpu_mem_.assign(kGpuBlocks * kBlockBytes, 0);

    events_.enable_kv_cache_events = true;
    events_.publisher = "zmq";
    events_.endpoint = "ipc://" + dir_ + "/kv-events";
    events_.replay_endpoint = "ipc://" + dir_ + "/kv-replay";
    events_.topic = "kv-events";
    JournalOptions jo;
    jo.dir = dir_ + "/journal";
    KVO_ASSIGN_OR_RETURN(journal_, Journal::Open(jo));
    PublisherOptions po;
    po.journal = journal_.get();  // batches are journaled before they are sent
    KVO_ASSIGN_OR_RETURN(publisher_, CreateEventPublisher(events_, 0, po));
    KVO_ASSIGN_OR_RETURN(manager_, BuildOffloadManager(StackOptions()));
    OffloadMetricsOptions mo;
    mo.engine_labels = {{"engine", name_}};
    mo.tiering = true;
    KVO_ASSIGN_OR_RETURN(exporter_, OffloadMetricsExporter::Create(&metrics_, mo));
    return Status::Ok();
  }

  OffloadStackOptions StackOptions() const {
    OffloadStackOptions o;
    o.config = config_;
    o.geometry = geometry_;
    o.cpu_rows = rows_;
    o.run.model_name = "kvo-demo/toy-model";
    o.enable_kv_cache_events = true;
    o.manager.publisher = publisher_.get();
    return o;
  }

  Status EndStep() {
    manager_->OnScheduleEnd();
    for (size_t t = 0; t < manager_->num_secondary_tiers(); ++t) {
      manager_->secondary_tier(t).Drain();  // a real engine polls; the demo waits
    }
    KVO_RETURN_IF_ERROR(manager_->PublishEvents());
    return exporter_->Export(manager_->GetStats());
  }

  // Waits for a transfer and feeds its result to the connector's metrics.
  Status Finish(JobId job) {
    const Status s = engine_->Wait(job);
    finished_.clear();
    engine_->TakeFinished(&finished_);
    for (const TransferResult& r : finished_) exporter_->RecordTransfer(r);
    return s;
  }

  // Lookups the file tier answered HIT (each starts a promotion into the CPU tier).
  uint64_t DiskHits() const {
    const ManagerStats s = manager_->GetStats();
    return s.tiers.size() > 1 ? s.tiers[1].block_hits : 0;
  }

  uint32_t Touch(uint64_t wire) {
    auto it = gpu_.find(wire);
    lru_.splice(lru_.end(), lru_, it->second.second);
    return it->second.first;
  }

  // A GPU block for `wire`, evicting the least recently used block this request does not use.
  Result<uint32_t> AllocateGpu(uint64_t wire, const std::vector<OffloadKey>& request,
                               EventBatch* events) {
    if (next_gpu_ < kGpuBlocks) return Place(wire, next_gpu_++);
    for (auto it = lru_.begin(); it != lru_.end(); ++it) {
      const uint64_t victim = *it;
      const bool in_use = std::any_of(request.begin(), request.end(),
                                      [&](const OffloadKey& k) { return k.Wire() == victim; });
      if (in_use) continue;
      const uint32_t id = gpu_[victim].first;
      gpu_.erase(victim);
      lru_.erase(it);
      BlockRemoved r;
      r.block_hashes = {BlockHash::Uint(victim)};
      r.medium = kMediumGpu;
      r.group_idx = 0;
      events->events.push_back(std::move(r));
      return Place(wire, id);
    }
    return Status::OutOfSpace("the GPU cache is smaller than one request");
  }
  uint32_t Place(uint64_t wire, uint32_t id) {
    lru_.push_back(wire);
    gpu_[wire] = {id, std::prev(lru_.end())};
    return id;
  }

  uintptr_t Row(int32_t slot) const {
    return rows_.base + static_cast<uint64_t>(slot) * rows_.row_stride;
  }
  uint8_t* GpuPtr(uint32_t id) { return gpu_mem_.data() + uint64_t{id} * kBlockBytes; }
  uintptr_t Gpu(uint32_t id) { return reinterpret_cast<uintptr_t>(GpuPtr(id)); }
  static double NowSeconds() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  }

  std::string name_, dir_;
  OffloadConfig config_;
  OffloadGeometry geometry_;
  KvEventsConfig events_;
  std::unique_ptr<TransferEngine> engine_;  // owns the CPU rows
  HostRegion rows_;
  std::vector<uint8_t> gpu_mem_;
  std::unique_ptr<Journal> journal_;
  std::unique_ptr<EventPublisher> publisher_;
  std::unique_ptr<OffloadManager> manager_;
  MetricsRegistry metrics_;  // what the engine's /metrics would serve
  std::unique_ptr<OffloadMetricsExporter> exporter_;
  std::vector<TransferResult> finished_;
  // GPU prefix cache: wire hash -> (block id, position in the LRU list).
  std::list<uint64_t> lru_;
  std::unordered_map<uint64_t, std::pair<uint32_t, std::list<uint64_t>::iterator>> gpu_;
  uint32_t next_gpu_ = 0;
  Counts counts_;
};

// Conversation c's prompt at turn t: the shared system prompt, then t turns of its own.
std::vector<int64_t> Prompt(int c, int t) {
  std::vector<int64_t> tokens;
  for (size_t i = 0; i < kSystemBlocks * kBlockTokens; ++i) tokens.push_back(100 + int64_t(i));
  for (int turn = 0; turn <= t; ++turn) {
    for (size_t i = 0; i < kTurnBlocks * kBlockTokens; ++i) {
      tokens.push_back(1000 + c * 100000 + turn * 1000 + int64_t(i));
    }
  }
  return tokens;
}

// Waits until the indexer applied everything each engine published.
Status WaitForIndexer(IndexerService& service, std::vector<std::unique_ptr<Engine>>& engines) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (auto& e : engines) {
    e->publisher().Flush();
    const std::optional<uint64_t> next = e->publisher().stats().next_seq;
    if (!next || *next == 0) continue;
    for (;;) {
      auto last = service.index().LastSequence(e->name(), 0);
      if (last.ok() && *last + 1 >= *next) break;
      if (std::chrono::steady_clock::now() > deadline) {
        return Status::Unavailable("the indexer did not catch up with " + e->name());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // polling a remote process
    }
  }
  return Status::Ok();
}

std::vector<std::string> SplitMetricLines(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1) {
    out.push_back(text.substr(start, nl - start));
  }
  return out;
}

void PrintScore(const ScoreResult& r, const char* what) {
  std::printf("#   %s: %lld query blocks\n", what, static_cast<long long>(r.query_blocks));
  for (const InstanceScore& s : r.instances) {
    std::string tiers;
    for (const auto& [medium, blocks] : s.blocks_per_medium) {
      tiers += " " + medium + "=" + std::to_string(blocks);
    }
    std::printf("#     %-9s prefix %3lld blocks (%5lld tokens), score %6.1f;%s\n", s.source.c_str(),
                static_cast<long long>(s.prefix_blocks), static_cast<long long>(s.prefix_tokens),
                s.score, tiers.empty() ? " nothing" : tiers.c_str());
  }
}

}  // namespace

Status RunPipelineDemo(const std::string& dir) {
  std::printf("\n# --- part 2: offload, tiers, events, indexer ---\n");
  std::printf("# each engine's --kv-transfer-config:\n%s\n",
              TransferConfigJson(dir + "/<engine>/fs").c_str());
  std::vector<std::unique_ptr<Engine>> engines;
  for (const char* name : {"engine-a", "engine-b"}) {
    KVO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> e, Engine::Start(name, dir + "/" + name));
    engines.push_back(std::move(e));
  }

  // The indexer follows both engines, checking their hashes (sha256_cbor, PYTHONHASHSEED=0).
  IndexerConfig ic;
  ic.db = dir + "/index.db";
  ic.http = "127.0.0.1:0";
  for (auto& e : engines) {
    SourceConfig s;
    s.name = e->name();
    s.endpoint = e->events_config().endpoint;
    s.replay_endpoint = e->events_config().replay_endpoint;
    s.topic = e->events_config().topic;
    s.hash = HashParityConfig{HashAlgo::kSha256Cbor, "0", kBlockTokens};
    ic.sources.push_back(std::move(s));
  }
  KVO_ASSIGN_OR_RETURN(std::unique_ptr<IndexerService> service, IndexerService::Start(ic));
  const std::string http = "127.0.0.1:" + std::to_string(service->http_port());
  std::printf("# indexer: %s, HTTP on %s\n", ic.db.c_str(), http.c_str());

  // Conversations alternate between the engines; turns interleave, so GPU caches churn.
  for (int t = 0; t < kTurns; ++t) {
    for (int c = 0; c < kConversations; ++c) {
      Engine& e = *engines[static_cast<size_t>(c % 2)];
      KVO_RETURN_IF_ERROR(
          e.Serve(Prompt(c, t), "conv" + std::to_string(c) + "-turn" + std::to_string(t)));
    }
  }
  for (auto& e : engines) {
    const Counts& k = e->counts();
    const ManagerStats s = e->manager().GetStats();
    std::printf(
        "# %s: %llu requests, %llu prompt blocks: %llu GPU hits, %llu from CPU, %llu promoted "
        "from disk, %llu computed; %llu scheduler steps waited on the file tier; %.1f MiB "
        "loaded, %.1f MiB offloaded; every loaded block verified (%llu); CPU evictions %llu\n",
        e->name().c_str(), (unsigned long long)k.requests, (unsigned long long)k.prompt_blocks,
        (unsigned long long)k.gpu_hits, (unsigned long long)k.cpu_hits,
        (unsigned long long)k.storage_hits, (unsigned long long)k.computed,
        (unsigned long long)k.deferred_steps, double(k.bytes_loaded) / (1 << 20),
        double(k.bytes_offloaded) / (1 << 20), (unsigned long long)k.verified,
        (unsigned long long)s.evictions);
  }

  // What engine-a's /metrics shows (vLLM's names; a few of the families).
  std::printf("# engine-a metrics (Prometheus text, vLLM's names), a selection:\n");
  for (const std::string& line : SplitMetricLines(engines[0]->metrics().RenderPrometheus())) {
    for (const char* want :
         {"vllm:kv_offload_store_bytes_total", "vllm:kv_offload_load_bytes_total",
          "vllm:kv_offload_cpu_cache_usage_perc", "vllm:kv_offload_tiering_block_hits_total",
          "kvo:offload_events_total"}) {
      if (line.rfind(want, 0) == 0) std::printf("#   %s\n", line.c_str());
    }
  }

  // A router asks: where should conversation 0's next turn go?
  KVO_RETURN_IF_ERROR(WaitForIndexer(*service, engines));
  KVO_ASSIGN_OR_RETURN(IndexerClient client, IndexerClient::Create(http));
  ScoreQuery q;
  q.token_ids = Prompt(0, kTurns);
  KVO_ASSIGN_OR_RETURN(ScoreResult before, client.Score(q));
  std::printf("# router: POST http://%s/v1/score {token_ids of conversation 0's next turn}\n",
              http.c_str());
  PrintScore(before, "answer");
  for (const SourceStatus& s : service->Sources()) {
    std::printf("# indexer source %s: hash parity %s (%llu blocks recomputed from their tokens)\n",
                s.name.c_str(), ParityStateName(s.parity.state),
                static_cast<unsigned long long>(s.parity.checked_blocks));
  }

  // engine-a restarts: its manager recovers from the journal; the indexer follows.
  KVO_RETURN_IF_ERROR(engines[0]->Restart());
  KVO_RETURN_IF_ERROR(WaitForIndexer(*service, engines));
  KVO_ASSIGN_OR_RETURN(ScoreResult after, client.Score(q));
  std::printf(
      "# engine-a's offload manager restarted (recovered from its journal: CPU blocks announced "
      "removed, the file tier reconciled with its directory):\n");
  PrintScore(after, "answer");
  service->Stop();
  return Status::Ok();
}

}  // namespace kvo::cli
