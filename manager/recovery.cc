// OffloadManager::Recover: restart from the journal (event sourcing). The journal's fold says what
// consumers were told; the new manager's CPU tier is empty (volatile), and the secondary tiers say
// what survived. One batch closes the difference.
#include <algorithm>
#include <map>
#include <optional>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/logging.h"
#include "manager/event_fold.h"
#include "manager/offload_manager_impl.h"

namespace kvo {
namespace {

ChunkMetadata MetadataOf(const BlockStored& s) {
  ChunkMetadata m;
  m.block_hashes = s.block_hashes;
  m.parent_block_hash = s.parent_block_hash;
  m.token_ids = s.token_ids;
  m.block_size = s.block_size;
  m.lora_id = s.lora_id;
  m.lora_name = s.lora_name;
  m.kv_cache_spec_kind = s.kv_cache_spec_kind;
  m.kv_cache_spec_sliding_window = s.kv_cache_spec_sliding_window;
  return m;
}

// Collects the restart removals: one BlockRemoved per (medium, group, locality).
class Removals {
 public:
  explicit Removals(std::vector<KvEvent>* out) : out_(out) {}
  void Add(const std::string& medium, int64_t group, const Announcement& a) {
    if (last_ != index_.end() && std::get<0>(last_->first) == medium &&
        std::get<1>(last_->first) == group && std::get<2>(last_->first) == a.locality) {
      Append(last_->second, a);  // the usual case: the same event as the previous chunk
      return;
    }
    auto [it, inserted] = index_.emplace(std::make_tuple(medium, group, a.locality), out_->size());
    last_ = it;
    if (inserted) {
      BlockRemoved r;
      r.medium = medium;
      r.group_idx = group;
      r.locality = a.locality;
      r.reason = kReasonRestart;
      out_->emplace_back(std::move(r));
    }
    Append(it->second, a);
  }
  uint64_t chunks() const { return chunks_; }

 private:
  void Append(size_t event, const Announcement& a) {
    auto& removed = std::get<BlockRemoved>((*out_)[event]);
    for (uint64_t h : a.hashes) removed.block_hashes.push_back(BlockHash::Uint(h));
    ++chunks_;
  }

  std::vector<KvEvent>* out_;
  using Index = std::map<std::tuple<std::string, int64_t, std::optional<std::string>>, size_t>;
  Index index_;
  Index::const_iterator last_ = index_.end();
  uint64_t chunks_ = 0;
};

}  // namespace

Result<std::unique_ptr<OffloadManager>> OffloadManager::Recover(ManagerOptions options,
                                                                Journal& journal) {
  KVO_ASSIGN_OR_RETURN(EventFold fold, ReplayJournal(journal));
  KVO_ASSIGN_OR_RETURN(std::unique_ptr<OffloadManager> manager, Create(std::move(options)));
  Impl& m = *manager->impl_;

  std::vector<KvEvent> events;
  Removals removals(&events);
  const std::vector<std::pair<EventFold::ChunkId, const FoldedChunk*>> chunks = fold.Sorted();
  // 1. The CPU tier is volatile: everything it announced is gone.
  for (const auto& [id, chunk] : chunks) {
    if (id.medium != EventFold::Medium::kCpu) continue;
    for (const Announcement& a : chunk->held) removals.Add(kMediumCpu, id.group, a);
  }
  const uint64_t cpu_chunks = removals.chunks();

  // 2. Each publishing secondary tier's blocks, matched against the journal's announcements of
  // the same chunk and locality: matched ones stay (in the form they were announced in), the
  // others are announced now; announcements nobody matched are removed.
  // open[k]: the still unmatched announcements of the k-th STORAGE chunk (in ChunkId order).
  std::vector<std::pair<int64_t, std::vector<const Announcement*>>> open;
  std::unordered_map<EventFold::ChunkId, size_t, EventFold::ChunkIdHash> open_index;
  for (const auto& [id, chunk] : chunks) {
    if (id.medium != EventFold::Medium::kStorage) continue;
    open_index.emplace(id, open.size());
    auto& [group, held] = open.emplace_back(id.group, std::vector<const Announcement*>());
    for (const Announcement& a : chunk->held) held.push_back(&a);
  }
  std::vector<KvEvent> stores;
  std::vector<OffloadKey> keys;
  for (size_t i = 0; i < m.tiers.size(); ++i) {
    SecondaryTier& t = *m.tiers[i];
    if (!t.publishes_events()) continue;
    const int32_t tier = static_cast<int32_t>(i + 1);
    keys.clear();
    t.ListHeld(&keys);
    for (const OffloadKey& key : keys) {
      auto it = open_index.find({EventFold::Medium::kStorage, key.group(), key.Wire()});
      std::shared_ptr<const BlockStored> template_event;
      if (it != open_index.end()) {
        std::vector<const Announcement*>& held = open[it->second].second;
        auto match = std::find_if(held.begin(), held.end(), [&](const Announcement* a) {
          return a->locality == t.locality();
        });
        if (match != held.end()) {
          if ((*match)->described) m.translator.Adopt(key, MetadataOf(*(*match)->described), tier);
          held.erase(match);
          continue;
        }
        for (const Announcement* a : held) {
          if (a->described) template_event = a->described;
        }
      }
      if (m.translator.self_describing() && template_event) {
        ChunkMetadata meta = MetadataOf(*template_event);
        stores.emplace_back(
            EventTranslator::DescribedStored(key, meta, std::string(t.medium()), t.locality()));
        m.translator.Adopt(key, std::move(meta), tier);
      } else {
        stores.emplace_back(
            EventTranslator::PlaceholderStored(key, std::string(t.medium()), t.locality()));
      }
    }
  }
  for (const auto& [group, held] : open) {
    for (const Announcement* a : held) removals.Add(kMediumStorage, group, *a);
  }
  const uint64_t announced_chunks = stores.size();
  const uint64_t removed_chunks = removals.chunks() - cpu_chunks;
  for (KvEvent& e : stores) events.push_back(std::move(e));

  KVO_LOG_INFO(
      "offload manager: recovered from {} journal batches: {} CPU chunks removed, {} storage "
      "chunks removed, {} announced",
      fold.batches(), cpu_chunks, removed_chunks, announced_chunks);
  KVO_RETURN_IF_ERROR(m.SendBatch(std::move(events)));
  return manager;
}

}  // namespace kvo
