// EventTranslator: OffloadingEvents -> vLLM KV events (vllm-compat.md B.9), as the connector's
// OffloadingEventsTracker does.
//   Placeholder form (default, or a key without metadata): one BlockStored per key with
//   block_hashes=[u64 key hash], no parent, no tokens, block_size 0, medium, group_idx = the key's
//   group, locality; one BlockRemoved per group with all of that group's hashes.
//   Self-describing form (enabled and metadata recorded): one BlockStored per chunk carrying the
//   chunk's per-block hashes, parent, tokens, block size, LoRA, kind; a removal fans out to the
//   chunk's per-block hashes, grouped by group.
// A removal is always rendered in the form its store was announced in (per tier), so a consumer
// folding the events holds exactly what the tiers hold. Metadata is kept while any tier holds the
// key in self-describing form and dropped on the removal that ends that.
//
// Thread-compatible.
#pragma once

#include <cstdint>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "events/event.h"
#include "manager/offload_key.h"
#include "manager/offload_manager.h"

namespace kvo {

class EventTranslator {
 public:
  explicit EventTranslator(bool self_describing) : self_describing_(self_describing) {}

  bool self_describing() const { return self_describing_; }

  // `chunk`: the chunk's BlockStored payload (OffloadManager::RecordChunkMetadata).
  void Record(const OffloadKey& key, BlockStored chunk, bool overwrite);
  // Drops metadata that no tier announced (a failed store). No-op otherwise.
  void ForgetUnannounced(const OffloadKey& key);
  // Recovery: `tier` holds `key` and announced it with `metadata`.
  void Adopt(const OffloadKey& key, BlockStored chunk, int32_t tier);

  // Appends the KV events of `event` to *out.
  void Translate(const OffloadingEvent& event, std::vector<KvEvent>* out);
  // The per-block hashes a stored announcement of `key` by `tier` carried (placeholder: the key's
  // wire hash), appended to *out.
  void AnnouncedHashes(const OffloadKey& key, int32_t tier, std::vector<uint64_t>* out) const;

  size_t metadata_size() const { return entries_.size(); }

  // The two forms, for one key. DescribedStored: `chunk` with this announcement's medium, group
  // (the key's) and locality.
  static BlockStored PlaceholderStored(const OffloadKey& key, Medium medium,
                                       const std::optional<std::string>& locality);
  static BlockStored DescribedStored(const OffloadKey& key, BlockStored chunk, Medium medium,
                                     const std::optional<std::string>& locality);

 private:
  struct Entry {
    std::optional<BlockStored> meta;  // the chunk's payload
    uint64_t described_tiers = 0;     // bit t: tier t announced the key in self-describing form
  };
  static uint64_t Bit(int32_t tier) { return tier >= 0 && tier < 64 ? (1ull << tier) : 0; }

  const bool self_describing_;
  std::unordered_map<OffloadKey, Entry, OffloadKeyHash> entries_;
  // Scratch for grouping removals: (group, index of its BlockRemoved in the output).
  std::vector<std::pair<uint32_t, size_t>> groups_;
};

}  // namespace kvo
