#include "manager/event_fold.h"

#include <memory>
#include <string>
#include <utility>

#include "events/codec.h"
#include "events/medium.h"

namespace kvo {

void JournalFold::Apply(const EventBatch& batch) {
  fold_.Apply(batch);
  for (const KvEvent& e : batch.events) {
    const auto* s = std::get_if<BlockStored>(&e);
    if (s == nullptr || s->block_hashes.empty()) continue;
    if (s->block_size <= 0 && s->token_ids.empty()) continue;  // a placeholder
    const Medium medium = s->medium ? MediumFromName(*s->medium) : Medium::kOther;
    if (medium != Medium::kCpu && medium != Medium::kStorage) continue;
    described_[{s->group_idx.value_or(0), s->block_hashes.back().Low64()}] =
        std::make_shared<const BlockStored>(*s);
  }
}

std::map<std::pair<int64_t, uint64_t>, int64_t> JournalFold::Hashes(std::string_view medium) const {
  std::map<std::pair<int64_t, uint64_t>, int64_t> out;
  for (const auto& [id, n] : fold_.ByBlock(medium)) out[{id.group, id.hash}] += n;
  return out;
}

std::shared_ptr<const BlockStored> JournalFold::Described(int64_t group, uint64_t last_hash) const {
  auto it = described_.find({group, last_hash});
  return it == described_.end() ? nullptr : it->second;
}

Result<JournalFold> ReplayJournal(Journal& journal) {
  JournalFold fold;
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
