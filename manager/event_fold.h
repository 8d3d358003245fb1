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
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "common/result.h"
#include "events/event.h"
#include "events/journal.h"

namespace kvo {

// One stored announcement of a chunk not yet removed.
struct Announcement {
  std::vector<uint64_t> hashes;          // the per-block hashes it carried (last = the chunk's)
  std::optional<std::string> locality;   // the announcing tier's locality
  std::optional<BlockStored> described;  // the event itself when self-describing
};

struct FoldedChunk {
  // Several tiers may hold a chunk in one medium: one announcement each. A removal takes the
  // announcement of its locality whose hashes it lists (the form it was announced in), else any.
  std::vector<Announcement> held;
};

class EventFold {
 public:
  // (medium, group, last block hash as u64)
  using ChunkId = std::tuple<std::string, int64_t, uint64_t>;

  void Apply(const EventBatch& batch);
  void Apply(const KvEvent& event);

  // Ordered by ChunkId (built on the first call after a change; Apply keeps a hash map).
  const std::map<ChunkId, FoldedChunk>& chunks() const;
  // Chunks of one medium with their counts, as (group, hash) -> count.
  std::map<std::pair<int64_t, uint64_t>, int64_t> Chunks(const std::string& medium) const;
  uint64_t batches() const { return batches_; }

 private:
  struct ChunkIdHash {
    size_t operator()(const ChunkId& id) const;
  };
  std::unordered_map<ChunkId, FoldedChunk, ChunkIdHash> chunks_;
  mutable std::map<ChunkId, FoldedChunk> ordered_;  // chunks() view
  mutable bool ordered_valid_ = true;
  uint64_t batches_ = 0;
};

// Replays every record of `journal` (from its first) into a fold. Corruption naming the seq when a
// payload does not decode.
Result<EventFold> ReplayJournal(Journal& journal);

}  // namespace kvo
