// kvo demo, part 2: the whole pipeline on this machine. Two engine instances (sim::SimEngine, the
// engine `kvo sim` serves, with synchronous steps) serve multi-turn
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

#include <chrono>
#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

#include "common/file_system.h"
#include "events/events.h"
#include "indexer/service/client.h"
#include "indexer/service/service.h"
#include "sim/engine.h"
#include "tools/commands.h"

namespace kvo::cli {
namespace {

constexpr int64_t kBlockTokens = 16;
constexpr uint64_t kBlockBytes = 32 << 10;  // one block's KV bytes in this toy model
constexpr size_t kGpuBlocks = 64;
constexpr int kConversations = 6;
constexpr int kTurns = 5;
constexpr size_t kSystemBlocks = 8;
constexpr size_t kTurnBlocks = 10;

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

// One engine instance (sim::SimEngine): its GPU prefix cache, its offload stack and its journaled
// event publisher, working files under `dir`.
Result<std::unique_ptr<sim::SimEngine>> StartEngine(const std::string& name,
                                                    const std::string& dir) {
  // The file tier's root_dir holds the engine's KV bytes: private, like the tier's own
  // directories (0700), whatever the umask.
  const std::string fs_root = dir + "/fs";
  KVO_RETURN_IF_ERROR(DefaultFileSystem()->CreateDirs(fs_root, FileOptions{}));
  struct stat st {};
  if (::stat(fs_root.c_str(), &st) != 0) return Status::IOError("stat '" + fs_root + "'");
  std::printf("# %s: file tier root_dir %s (mode %04o)\n", name.c_str(), fs_root.c_str(),
              static_cast<unsigned>(st.st_mode & 07777));
  sim::SimEngineOptions o;
  o.instance_id = name;
  o.model = "kvo-demo/toy-model";
  o.workdir = dir;
  o.block_size = kBlockTokens;
  o.gpu_blocks = kGpuBlocks;
  o.bytes_per_token = kBlockBytes / kBlockTokens;
  o.kv_transfer_config = TransferConfigJson(fs_root);
  o.events.enable_kv_cache_events = true;
  o.events.publisher = "zmq";
  o.events.endpoint = "ipc://" + dir + "/kv-events";
  o.events.replay_endpoint = "ipc://" + dir + "/kv-replay";
  o.events.topic = "kv-events";
  // The GPU events carry real vLLM sha256_cbor hashes (PYTHONHASHSEED=0).
  o.hash_algo = HashAlgo::kSha256Cbor;
  o.hash_seed = "0";
  o.synchronous_steps = true;  // the tour's figures repeat run after run
  return sim::SimEngine::Open(o);
}

// Serves one request; a block loaded back with the wrong bytes ends the tour.
Status Serve(sim::SimEngine& e, const std::vector<int64_t>& prompt, const std::string& req_id) {
  const std::vector<uint32_t> tokens(prompt.begin(), prompt.end());
  KVO_ASSIGN_OR_RETURN(sim::ServeResult r, e.Serve(tokens, req_id));
  if (r.mismatches > 0) {
    return Status::Corruption(req_id + ": " + std::to_string(r.mismatches) +
                              " blocks loaded from the offload tiers have the wrong bytes");
  }
  return Status::Ok();
}

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
Status WaitForIndexer(IndexerService& service,
                      std::vector<std::unique_ptr<sim::SimEngine>>& engines) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (auto& e : engines) {
    const std::string& name = e->options().instance_id;
    e->FlushEvents();
    const std::optional<uint64_t> next = e->NextEventSeq();
    if (!next || *next == 0) continue;
    for (;;) {
      auto last = service.index().LastSequence(name, 0);
      if (last.ok() && *last + 1 >= *next) break;
      if (std::chrono::steady_clock::now() > deadline) {
        return Status::Unavailable("the indexer did not catch up with " + name);
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
  std::vector<std::unique_ptr<sim::SimEngine>> engines;
  for (const char* name : {"engine-a", "engine-b"}) {
    KVO_ASSIGN_OR_RETURN(std::unique_ptr<sim::SimEngine> e, StartEngine(name, dir + "/" + name));
    engines.push_back(std::move(e));
  }

  // The indexer follows both engines, checking their hashes (sha256_cbor, PYTHONHASHSEED=0).
  IndexerConfig ic;
  ic.db = dir + "/index.db";
  ic.http = "127.0.0.1:0";
  for (auto& e : engines) {
    SourceConfig s;
    s.name = e->options().instance_id;
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
      sim::SimEngine& e = *engines[static_cast<size_t>(c % 2)];
      KVO_RETURN_IF_ERROR(
          Serve(e, Prompt(c, t), "conv" + std::to_string(c) + "-turn" + std::to_string(t)));
    }
  }
  for (auto& e : engines) {
    const sim::EngineCounters k = e->Counters();
    const auto blocks = [](uint64_t tokens) {
      return static_cast<unsigned long long>(tokens / kBlockTokens);
    };
    std::printf(
        "# %s: %llu requests, %llu prompt blocks: %llu GPU hits, %llu from CPU, %llu promoted "
        "from disk, %llu computed; %llu scheduler steps waited on the file tier; %.1f MiB "
        "loaded, %.1f MiB offloaded; every loaded block verified (%llu); CPU evictions %llu\n",
        e->options().instance_id.c_str(), (unsigned long long)k.requests, blocks(k.prompt_tokens),
        blocks(k.hit_tokens[sim::kGpu]), blocks(k.hit_tokens[sim::kCpu]),
        blocks(k.hit_tokens[sim::kDisk]), blocks(k.prefill_tokens_computed),
        (unsigned long long)k.deferred_steps,
        double(k.bytes_loaded[sim::kCpu] + k.bytes_loaded[sim::kDisk]) / (1 << 20),
        double(k.bytes_stored[sim::kCpu]) / (1 << 20), (unsigned long long)k.blocks_verified,
        (unsigned long long)k.cpu_evictions);
  }

  // What engine-a's /metrics shows (vLLM's names; a few of the families).
  std::printf("# engine-a metrics (Prometheus text, vLLM's names), a selection:\n");
  for (const std::string& line : SplitMetricLines(engines[0]->PrometheusText())) {
    for (const char* want :
         {"vllm:kv_offload_store_bytes_total", "vllm:kv_offload_load_bytes_total",
          "vllm:kv_offload_cpu_cache_usage_perc", "vllm:kv_offload_tiering_chunk_hits_total",
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
  KVO_RETURN_IF_ERROR(engines[0]->RestartOffloadManager());
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
