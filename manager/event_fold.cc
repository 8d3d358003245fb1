#include "manager/event_fold.h"

#include <memory>
#include <unordered_set>
#include <utility>

#include "events/codec.h"

namespace kvo {
namespace {

bool Folded(const std::optional<std::string>& medium) {
  return medium.has_value() && (*medium == kMediumCpu || *medium == kMediumStorage);
}

}  // namespace

size_t EventFold::ChunkIdHash::operator()(const ChunkId& id) const {
  uint64_t h = std::get<2>(id) ^ (static_cast<uint64_t>(std::get<1>(id)) * 0x9e3779b97f4a7c15ULL);
  h ^= std::hash<std::string>()(std::get<0>(id));
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  return static_cast<size_t>(h);
}

const std::map<EventFold::ChunkId, FoldedChunk>& EventFold::chunks() const {
  if (!ordered_valid_) {
    ordered_.clear();
    ordered_.insert(chunks_.begin(), chunks_.end());
    ordered_valid_ = true;
  }
  return ordered_;
}

void EventFold::Apply(const EventBatch& batch) {
  ++batches_;
  for (const KvEvent& e : batch.events) Apply(e);
}

void EventFold::Apply(const KvEvent& event) {
  ordered_valid_ = false;
  if (const auto* s = std::get_if<BlockStored>(&event)) {
    if (!Folded(s->medium) || s->block_hashes.empty()) return;
    const int64_t group = s->group_idx.value_or(0);
    FoldedChunk& c = chunks_[ChunkId{*s->medium, group, s->block_hashes.back().Low64()}];
    Announcement& a = c.held.emplace_back();
    for (const BlockHash& h : s->block_hashes) a.hashes.push_back(h.Low64());
    a.locality = s->locality;
    if (s->block_size > 0 || !s->token_ids.empty()) a.described = *s;
    return;
  }
  if (const auto* r = std::get_if<BlockRemoved>(&event)) {
    if (!Folded(r->medium)) return;
    const int64_t group = r->group_idx.value_or(0);
    std::unordered_set<uint64_t> listed;  // filled when a chunk has several announcements
    for (const BlockHash& h : r->block_hashes) {
      auto it = chunks_.find(ChunkId{*r->medium, group, h.Low64()});
      if (it == chunks_.end()) continue;
      std::vector<Announcement>& held = it->second.held;
      if (held.size() == 1) {  // the only announcement goes
        chunks_.erase(it);
        continue;
      }
      if (listed.empty()) {
        for (const BlockHash& x : r->block_hashes) listed.insert(x.Low64());
      }
      auto covered = [&](const Announcement& a) {
        for (uint64_t x : a.hashes) {
          if (listed.count(x) == 0) return false;
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
  ordered_.clear();
}

std::map<std::pair<int64_t, uint64_t>, int64_t> EventFold::Chunks(const std::string& medium) const {
  std::map<std::pair<int64_t, uint64_t>, int64_t> out;
  for (const auto& [id, chunk] : chunks_) {
    if (std::get<0>(id) == medium)
      out[{std::get<1>(id), std::get<2>(id)}] = static_cast<int64_t>(chunk.held.size());
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
