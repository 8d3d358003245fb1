// kvo demo --tour: a self-contained tour of the KV-event bus inside one process. A journaled
// publisher emits vLLM-format batches (GPU prefix-cache stores with real vLLM block hashes, CPU
// offload placeholders, evictions, a clear); a subscriber joins late and catches up by replay
// (beyond the in-memory ring, from the journal), then follows live; every batch arrives once, in
// order. Part 2 (tools/demo_pipeline.cc) runs the whole pipeline: offload tiers, events, the
// indexer.
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "common/file_system.h"
#include "events/events.h"
#include "tools/commands.h"

namespace kvo::cli {

Status RunTour(int batches, bool json) {
  ScopedTempDir scratch("demo");
  if (scratch.path().empty()) return scratch.status();
  const std::string& dir = scratch.path();

  // 1. vLLM's chained block hashes for a prompt (sha256_cbor, PYTHONHASHSEED=0, 16-token blocks).
  BlockHashOptions ho;
  ho.algo = HashAlgo::kSha256Cbor;
  ho.none_hash = NoneHash(ho.algo, "0");
  ho.block_size = 16;
  std::vector<int64_t> prompt;
  prompt.reserve(64);
  for (int64_t t = 0; t < 64; ++t) prompt.push_back(1000 + t * 7);
  KVO_ASSIGN_OR_RETURN(std::vector<std::string> digests, HashBlocks(prompt, ho));
  std::vector<BlockHash> hashes;
  hashes.reserve(digests.size());
  for (const std::string& d : digests) hashes.push_back(BlockHash::Uint(BlockDigest::Low64(d)));
  std::printf("# block hashes (sha256_cbor, seed \"0\", block_size 16) of a 64-token prompt:");
  for (const BlockHash& h : hashes) std::printf(" %s", h.ToString().c_str());
  std::printf("\n");

  // 2. A journaled publisher with a ring of only 4 batches, so a late subscriber needs the journal.
  KvEventsConfig config;
  config.enable_kv_cache_events = true;
  config.publisher = "zmq";
  config.endpoint = "ipc://" + dir + "/kv-events";
  config.replay_endpoint = "ipc://" + dir + "/kv-replay";
  config.topic = "kv-events";
  config.buffer_steps = 4;
  config.journal_dir = dir + "/journal";
  KVO_ASSIGN_OR_RETURN(auto publisher, CreateEventPublisher(config, 0));
  std::printf("# publisher: %s (replay %s, journal %s)\n", config.endpoint.c_str(),
              config.replay_endpoint->c_str(), config.journal_dir->c_str());

  double ts = 1700000000.0;
  auto step = [&](int i) {
    EventBatch b{ts + i, {}, std::nullopt};
    BlockStored gpu;
    size_t k = static_cast<size_t>(i) % hashes.size();
    gpu.block_hashes = {hashes[k]};
    if (k > 0) gpu.parent_block_hash = hashes[k - 1];
    gpu.token_ids.assign(prompt.begin() + 16 * k, prompt.begin() + 16 * (k + 1));
    gpu.block_size = 16;
    gpu.medium = kMediumGpu;
    gpu.extra_keys = std::vector<Value>(1);
    gpu.group_idx = 0;
    gpu.kv_cache_spec_kind = "full_attention";
    b.events.push_back(gpu);
    if (i % 3 == 1) {  // the block was offloaded to CPU (placeholder event, as vLLM's default)
      BlockStored cpu;
      cpu.block_hashes = {hashes[k]};
      cpu.medium = kMediumCpu;
      cpu.group_idx = 0;
      b.events.push_back(cpu);
    }
    if (i % 4 == 3) {  // GPU memory filled: an eviction
      BlockRemoved r;
      r.block_hashes = {hashes[k]};
      r.medium = kMediumGpu;
      r.group_idx = 0;
      r.reason = "evicted";
      b.events.push_back(r);
    }
    if (i == batches - 1) b.events.push_back(AllBlocksCleared{});
    return b;
  };

  int early = batches / 2;
  for (int i = 0; i < early; ++i) KVO_RETURN_IF_ERROR(publisher->Publish(step(i)));
  publisher->Flush();
  std::printf("# published %d batches before any subscriber existed\n", early);

  // 3. A late subscriber: replay from seq 0 (journal beyond the 4-batch ring), then live.
  SubscriberOptions so;
  so.endpoint = config.endpoint;
  so.replay_endpoint = config.replay_endpoint;
  so.topic = config.topic;
  so.start_seq = 0;
  KVO_ASSIGN_OR_RETURN(auto subscriber, Subscriber::Create(so));
  int received = 0, replayed = 0;
  auto drain = [&](int upto) -> Status {
    while (received < upto) {
      KVO_ASSIGN_OR_RETURN(auto next, subscriber->Next(std::chrono::seconds(10)));
      if (!next) return Status::Unavailable("no batch within 10 s");
      if (next->seq != static_cast<uint64_t>(received)) {
        return Status::Internal("out of order: got seq " + std::to_string(next->seq));
      }
      replayed += next->replayed;
      std::string line = json ? BatchToJson(next->batch, next->seq, next->topic)
                              : BatchToText(next->batch, next->seq);
      const char* tag = next->replayed ? "[replay] " : "[live]   ";
      for (size_t pos = 0; (pos = line.find('\n', pos)) != std::string::npos; pos += 10) {
        line.replace(pos, 1, "\n         ");
      }
      std::printf("%s%s\n", tag, line.c_str());
      ++received;
    }
    return Status::Ok();
  };
  KVO_RETURN_IF_ERROR(drain(early));
  for (int i = early; i < batches; ++i) KVO_RETURN_IF_ERROR(publisher->Publish(step(i)));
  KVO_RETURN_IF_ERROR(drain(batches));

  PublisherStats ps = publisher->stats();
  SubscriberStats ss = subscriber->stats();
  publisher->Shutdown();
  std::printf(
      "# summary: published %llu batches (%llu block events); subscriber received %d in order, "
      "%d by replay (%llu served from the journal), %llu lost\n",
      static_cast<unsigned long long>(ps.batches_published),
      static_cast<unsigned long long>(ps.block_events_published), received, replayed,
      static_cast<unsigned long long>(ps.replay_from_journal),
      static_cast<unsigned long long>(ss.batches_lost));
  if (ss.batches_lost != 0 || received != batches) return Status::Internal("demo lost batches");
  return RunPipelineDemo(dir);
}

}  // namespace kvo::cli
