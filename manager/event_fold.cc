#include "manager/event_fold.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "events/codec.h"

namespace kvo {
namespace {

std::optional<EventFold::Medium> Folded(const std::optional<std::string>& medium) {
  if (!medium.has_value()) return std::nullopt;
  if (*medium == kMediumCpu) return EventFold::Medium::kCpu;
  if (*medium == kMediumStorage) return EventFold::Medium::kStorage;
  return std::nullopt;
}

}  // namespace

size_t EventFold::ChunkIdHash::operator()(const ChunkId& id) const {
  uint64_t h = id.hash ^ (static_cast<uint64_t>(id.group) * 0x9e3779b97f4a7c15ULL) ^
               static_cast<uint64_t>(id.medium);
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  return static_cast<size_t>(h);
}

std::vector<std::pair<EventFold::ChunkId, const FoldedChunk*>> EventFold::Sorted() const {
  std::vector<std::pair<ChunkId, const FoldedChunk*>> out;
  out.reserve(chunks_.size());
  for (const auto& [id, chunk] : chunks_) out.emplace_back(id, &chunk);
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return out;
}

void EventFold::Apply(const EventBatch& batch) {
  ++batches_;
  for (const KvEvent& e : batch.events) Apply(e);
}

void EventFold::Apply(const KvEvent& event) {
  if (const auto* s = std::get_if<BlockStored>(&event)) {
    const std::optional<Medium> medium = Folded(s->medium);
    if (!medium.has_value() || s->block_hashes.empty()) return;
    FoldedChunk& c =
        chunks_[ChunkId{*medium, s->group_idx.value_or(0), s->block_hashes.back().Low64()}];
    Announcement& a = c.held.emplace_back();
    a.hashes.reserve(s->block_hashes.size());
    for (const BlockHash& h : s->block_hashes) a.hashes.push_back(h.Low64());
    a.locality = s->locality;
    if (s->block_size > 0 || !s->token_ids.empty()) a.described = std::make_shared<BlockStored>(*s);
    return;
  }
  if (const auto* r = std::get_if<BlockRemoved>(&event)) {
    const std::optional<Medium> medium = Folded(r->medium);
    if (!medium.has_value()) return;
    const int64_t group = r->group_idx.value_or(0);
    listed_.clear();  // filled when a chunk has several announcements
    for (const BlockHash& h : r->block_hashes) {
      auto it = chunks_.find(ChunkId{*medium, group, h.Low64()});
      if (it == chunks_.end()) continue;
      std::vector<Announcement>& held = it->second.held;
      if (held.size() == 1) {  // the only announcement goes
        chunks_.erase(it);
        continue;
      }
      if (listed_.empty()) {
        for (const BlockHash& x : r->block_hashes) listed_.push_back(x.Low64());
        std::sort(listed_.begin(), listed_.end());
      }
      auto covered = [&](const Announcement& a) {
        for (uint64_t x : a.hashes) {
          if (!std::binary_search(listed_.begin(), listed_.end(), x)) return false;
        }
        return true;
      };
      // Best match: same locality and listed in full; then same locality; then anything.
      size_t best = 0;
      int best_score = -1;
      for (size_t i = 0; i < held.size(); ++i) {
        const int score = (held[i].locality == r->locality ? 2 : 0) + (covered(held[i]) ? 1 : 0);
        if (score > best_score) {
          best_score = score;
          best = i;
        }
      }
      held.erase(held.begin() + static_cast<std::ptrdiff_t>(best));
      if (held.empty()) chunks_.erase(it);
    }
    return;
  }
  chunks_.clear();  // AllBlocksCleared
}

std::map<std::pair<int64_t, uint64_t>, int64_t> EventFold::Chunks(const std::string& medium) const {
  std::map<std::pair<int64_t, uint64_t>, int64_t> out;
  const std::optional<Medium> m = Folded(medium);
  if (!m.has_value()) return out;
  for (const auto& [id, chunk] : chunks_) {
    if (id.medium == *m) out[{id.group, id.hash}] = static_cast<int64_t>(chunk.held.size());
  }
  return out;
}

Result<EventFold> ReplayJournal(Journal& journal) {
  EventFold fold;
  if (journal.empty()) return fold;
  KVO_ASSIGN_OR_RETURN(std::unique_ptr<JournalReader> reader,
                       journal.NewReader(journal.first_seq()));
  JournalRecord record;
  while (true) {
    KVO_ASSIGN_OR_RETURN(bool more, reader->Next(&record));
    if (!more) break;
    Result<EventBatch> batch = DecodeBatch(record.payload);
    if (!batch.ok()) {
      return Status::Corruption("journal record seq " + std::to_string(record.seq) + ": " +
                                batch.status().message());
    }
    fold.Apply(*batch);
  }
  return fold;
}

}  // namespace kvo
