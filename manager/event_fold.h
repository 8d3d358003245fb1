// EventFold: the offload manager's state as a fold over its KV events (event sourcing). Folds the
// CPU and STORAGE BlockStored / BlockRemoved events into the set of chunks each medium holds; a
// chunk is identified by (medium, group, its last block hash) — the offload key's hash in both
// event forms (B.4: a chunk's key is its last hash; this assumes tokens_per_hash == the group's
// block size, vLLM's default). A removal removes each chunk whose last hash it lists (removals of
// unknown hashes are ignored, as vLLM tells consumers to); AllBlocksCleared clears everything;
// a chunk held by several tiers of one medium counts once per tier (matched by locality);
// events of other media (GPU) are ignored.
//
// Thread-compatible value type.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/result.h"
#include "events/event.h"
#include "events/journal.h"

namespace kvo {

// One stored announcement of a chunk not yet removed.
struct Announcement {
  std::vector<uint64_t> hashes;         // the per-block hashes it carried (last = the chunk's)
  std::optional<std::string> locality;  // the announcing tier's locality
  // The event itself when self-describing (its block_hashes are `hashes`).
  std::shared_ptr<const BlockStored> described;
};

struct FoldedChunk {
  // Several tiers may hold a chunk in one medium: one announcement each. A removal takes the
  // announcement of its locality whose hashes it lists (the form it was announced in), else any.
  std::vector<Announcement> held;
};

class EventFold {
 public:
  // The two folded media.
  enum class Medium : uint8_t { kCpu, kStorage };
  // A chunk: (medium, group, last block hash as u64).
  struct ChunkId {
    Medium medium;
    int64_t group;
    uint64_t hash;
    friend bool operator==(const ChunkId&, const ChunkId&) = default;
    friend auto operator<=>(const ChunkId&, const ChunkId&) = default;
  };

  EventFold() { chunks_.max_load_factor(0.5f); }

  void Apply(const EventBatch& batch);
  void Apply(const KvEvent& event);

  // Every chunk held, ordered by ChunkId (sorted on each call).
  std::vector<std::pair<ChunkId, const FoldedChunk*>> Sorted() const;
  // Chunks of one medium with their counts, as (group, hash) -> count.
  std::map<std::pair<int64_t, uint64_t>, int64_t> Chunks(const std::string& medium) const;
  uint64_t batches() const { return batches_; }

  struct ChunkIdHash {
    size_t operator()(const ChunkId& id) const;
  };

 private:
  std::unordered_map<ChunkId, FoldedChunk, ChunkIdHash> chunks_;
  std::vector<uint64_t> listed_;  // scratch: a removal's hashes, sorted
  uint64_t batches_ = 0;
};

// Replays every record of `journal` (from its first) into a fold. Corruption naming the seq when a
// payload does not decode.
Result<EventFold> ReplayJournal(Journal& journal);

}  // namespace kvo
