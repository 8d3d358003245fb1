// The manager's journal, folded: the one meaning of KV events (events/event_fold.h, schemas/
// kv_events.md "Semantics") over the manager's single stream, plus what recovery needs besides the
// counts: the self-describing form each chunk was announced in, to re-adopt its metadata.
//
// Thread-compatible value type.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string_view>
#include <utility>

#include "common/result.h"
#include "events/event.h"
#include "events/event_fold.h"
#include "events/journal.h"

namespace kvo {

class JournalFold {
 public:
  void Apply(const EventBatch& batch);

  const KvEventFold& fold() const { return fold_; }
  // (group, hash) -> count, summed over residency, of one medium: what a reference-counting
  // consumer of the manager's events holds (OffloadManager::Snapshot's cpu_hashes/storage_hashes).
  std::map<std::pair<int64_t, uint64_t>, int64_t> Hashes(std::string_view medium) const;
  // The last self-describing BlockStored announced for the chunk (group, last block hash) in any
  // offload medium, or nullptr.
  std::shared_ptr<const BlockStored> Described(int64_t group, uint64_t last_hash) const;
  uint64_t batches() const { return fold_.batches(); }

 private:
  KvEventFold fold_;
  std::map<std::pair<int64_t, uint64_t>, std::shared_ptr<const BlockStored>> described_;
};

// Replays every record of `journal` (from its first) into a fold. Corruption naming the seq when a
// payload does not decode.
Result<JournalFold> ReplayJournal(Journal& journal);

}  // namespace kvo
