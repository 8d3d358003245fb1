// KvEventFold: the one meaning of a sequence of KV events (schemas/kv_events.md, "Semantics").
//
// The state is a reference count per (stream, medium, group, hash, residency):
//   - BlockStored adds 1 to (stream, medium, group, h, locality, ownership) for every listed
//     hash h;
//   - BlockRemoved subtracts 1 for every listed hash h (a hash listed twice, twice); a removal of
//     an entry the stream does not hold is ignored (vLLM: consumers reference-count and ignore
//     removals of unknown hashes) and counted in unknown_removals();
//   - AllBlocksCleared drops every GPU entry of the stream that no secondary tier owns (ownership
//     unset or empty: the framework's copy), and nothing else (vLLM emits it from
//     reset_prefix_cache(); it does not clear the CPU or storage tiers, nor a tier's own copy, and
//     its consumers read it so; kvo's indexer does the same).
// A missing medium is GPU (vLLM's events before #19737), a missing group is 0, the hash is its
// 64-bit wire form (BlockHash::Low64()), the residency is the event's `locality` (LOCAL, REMOTE or
// unset): a block held by a local and a remote tier of one medium is two entries. So is a block
// held by the framework and by a secondary tier that names itself in `ownership` (vLLM's KVCR
// tier: "kvcr"); an unset and an empty ownership are the same (the framework's), as in kvo's
// indexer, whose residency is the medium and ownership (it ignores locality).
//
// Consumers that ignore locality (kvo's indexer, vLLM's routers) hold the same counts summed over
// residency (ByBlock); they agree with the fold as long as a publisher removes a block with the
// locality it stored it with (kvo's manager always does).
//
// Thread-compatible value type.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "events/event.h"

namespace kvo {

// The medium an event means: its `medium`, GPU when it names none (vLLM before #19737). Every
// reader of events uses this rule.
inline std::string_view MediumOf(const std::optional<std::string>& medium) {
  return medium.has_value() ? std::string_view(*medium) : std::string_view(kMediumGpu);
}

// A publisher stream: vLLM's (publisher, data_parallel_rank).
struct EventStream {
  std::string source;
  int64_t dp_rank = 0;
  friend bool operator==(const EventStream&, const EventStream&) = default;
  friend auto operator<=>(const EventStream&, const EventStream&) =
      default;  // NOLINT(modernize-use-nullptr): clang 14 on a defaulted <=>
};

// One held entry of the fold.
struct FoldEntry {
  EventStream stream;
  std::string medium;
  int64_t group = 0;
  uint64_t hash = 0;
  std::optional<std::string> residency;  // the events' locality
  std::string ownership;                 // the events' ownership ("": unset, the framework's)
  int64_t refcount = 0;                  // > 0
  friend bool operator==(const FoldEntry&, const FoldEntry&) = default;
};

// (stream, medium, group, hash) -> refcount: what a consumer that ignores locality holds.
struct BlockId {
  EventStream stream;
  std::string medium;
  int64_t group = 0;
  uint64_t hash = 0;
  friend bool operator==(const BlockId&, const BlockId&) = default;
  friend auto operator<=>(const BlockId&, const BlockId&) =
      default;  // NOLINT(modernize-use-nullptr): clang 14 on a defaulted <=>
};
using BlockCounts = std::map<BlockId, int64_t>;

class KvEventFold {
 public:
  KvEventFold();

  void Apply(const EventStream& stream, const EventBatch& batch);
  void Apply(const EventStream& stream, const KvEvent& event);
  // The same for the single stream {"", 0} (a manager folding its own journal).
  void Apply(const EventBatch& batch) { Apply(EventStream{}, batch); }
  void Apply(const KvEvent& event) { Apply(EventStream{}, event); }

  // Forgets every entry of one stream (a subscriber that saw the publisher restart), or of every
  // rank of a source.
  void ClearStream(const EventStream& stream);
  void ClearSource(std::string_view source);

  // Every held entry, sorted by (stream, medium, group, hash, residency, ownership).
  std::vector<FoldEntry> Entries() const;
  // The counts summed over residency, optionally of one medium only.
  BlockCounts ByBlock(std::optional<std::string_view> medium = std::nullopt) const;
  // The count of one entry of the framework's copy (ownership unset; 0 when not held).
  int64_t Count(const EventStream& stream, std::string_view medium, int64_t group, uint64_t hash,
                const std::optional<std::string>& residency) const;
  size_t size() const { return counts_.size(); }

  uint64_t batches() const { return batches_; }
  uint64_t unknown_removals() const { return unknown_removals_; }

 private:
  struct Key {
    uint32_t stream;
    uint32_t medium;
    uint32_t residency;  // 0: unset
    uint32_t ownership;  // 0: unset or empty
    int64_t group;
    uint64_t hash;
    friend bool operator==(const Key&, const Key&) = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const;
  };
  uint32_t StreamId(const EventStream& stream);
  uint32_t MediumId(const std::optional<std::string>& medium);
  uint32_t ResidencyId(const std::optional<std::string>& locality);
  uint32_t OwnershipId(const std::optional<std::string>& ownership);
  // A stored or removed event's key, hash 0 (set per listed hash).
  template <typename Event>
  Key KeyOf(uint32_t stream, const Event& e);
  std::optional<uint32_t> FindStream(const EventStream& stream) const;
  FoldEntry EntryOf(const Key& k, int64_t count) const;

  std::unordered_map<Key, int64_t, KeyHash> counts_;
  std::vector<EventStream> streams_;
  std::vector<std::string> media_;        // media_[0] == "GPU"
  std::vector<std::string> residencies_;  // residencies_[0]: unset (empty)
  std::vector<std::string> owners_;       // owners_[0]: unset or empty
  uint64_t batches_ = 0;
  uint64_t unknown_removals_ = 0;
};

// A 64-bit digest of block counts (FNV-1a over the sorted entries): two consumers hold the same
// blocks iff (with overwhelming probability) their digests are equal.
uint64_t DigestOf(const BlockCounts& counts);

}  // namespace kvo
