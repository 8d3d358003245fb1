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
#include "manager/offload_manager_internal.h"

namespace kvo {
namespace {

// Collects the restart removals: one BlockRemoved per (medium, group, residency), each hash listed
// once per reference the consumers hold.
class Removals {
 public:
  explicit Removals(std::vector<KvEvent>* out) : out_(out) {}
  void Add(Medium medium, int64_t group, const std::optional<std::string>& residency, uint64_t hash,
           int64_t count) {
    auto [it, inserted] = index_.emplace(std::make_tuple(medium, group, residency), out_->size());
    if (inserted) {
      BlockRemoved r;
      r.medium = std::string(MediumName(medium));
      r.group_idx = group;
      r.locality = residency;
      r.reason = std::string(RemovalReasonName(RemovalReason::kRestart));
      out_->emplace_back(std::move(r));
    }
    auto& removed = std::get<BlockRemoved>((*out_)[it->second]);
    for (int64_t i = 0; i < count; ++i) removed.block_hashes.push_back(BlockHash::Uint(hash));
    blocks_ += static_cast<uint64_t>(count);
  }
  uint64_t blocks() const { return blocks_; }

 private:
  std::vector<KvEvent>* out_;
  std::map<std::tuple<Medium, int64_t, std::optional<std::string>>, size_t> index_;
  uint64_t blocks_ = 0;
};

using ResidentBlock = std::tuple<int64_t, uint64_t, std::optional<std::string>>;

}  // namespace

Result<std::unique_ptr<OffloadManager>> OffloadManager::Recover(ManagerOptions options,
                                                                Journal& journal) {
  KVO_ASSIGN_OR_RETURN(JournalFold journaled, ReplayJournal(journal));
  options.announce_held_blocks = false;  // the reconcile below announces what the journal lacks
  KVO_ASSIGN_OR_RETURN(std::unique_ptr<OffloadManager> manager, Create(std::move(options)));
  Impl& m = *manager->impl_;

  // What consumers hold (the fold, schemas/kv_events.md "Semantics") against what survived: the
  // difference is one batch of removals, then stores.
  std::vector<KvEvent> events;
  Removals removals(&events);
  // 1. The CPU tier is volatile: everything it announced is gone.
  // 2. The STORAGE announcements still open, to be matched with the tiers' blocks.
  std::map<ResidentBlock, int64_t> open;
  for (const FoldEntry& e : journaled.fold().Entries()) {
    const Medium medium = MediumFromName(e.medium);
    if (medium == Medium::kCpu) {
      removals.Add(Medium::kCpu, e.group, e.residency, e.hash, e.refcount);
    } else if (medium == Medium::kStorage) {
      open[{e.group, e.hash, e.residency}] += e.refcount;
    }
  }
  const uint64_t cpu_blocks = removals.blocks();

  // 3. Each publishing secondary tier's blocks: a block announced with the tier's locality (in
  // the self-describing form its chunk was announced in, else as a placeholder) stays; the others
  // are announced now. Announcements nobody matched are removed.
  auto take = [&open](int64_t group, const std::vector<uint64_t>& hashes,
                      const std::optional<std::string>& residency) {
    for (uint64_t h : hashes) {
      auto it = open.find({group, h, residency});
      if (it == open.end() || it->second <= 0) return false;
    }
    for (uint64_t h : hashes) --open[{group, h, residency}];
    return true;
  };
  std::vector<KvEvent> stores;
  std::vector<OffloadKey> keys;
  std::vector<uint64_t> hashes;
  for (size_t i = 0; i < m.tiers.size(); ++i) {
    SecondaryTier& t = *m.tiers[i];
    if (!t.publishes_events()) continue;
    const int32_t tier = static_cast<int32_t>(i + 1);
    keys.clear();
    t.ListHeld(&keys);
    for (const OffloadKey& key : keys) {
      const std::shared_ptr<const BlockStored> described =
          journaled.Described(key.group(), key.Wire());
      if (described != nullptr) {
        hashes.clear();
        for (const BlockHash& h : described->block_hashes) hashes.push_back(h.Low64());
        if (take(key.group(), hashes, t.locality())) {
          m.translator.Adopt(key, *described, tier);
          continue;
        }
      }
      if (take(key.group(), {key.Wire()}, t.locality())) continue;
      if (m.translator.self_describing() && described != nullptr) {
        stores.emplace_back(
            EventTranslator::DescribedStored(key, *described, t.medium(), t.locality()));
        m.translator.Adopt(key, *described, tier);
      } else {
        stores.emplace_back(EventTranslator::PlaceholderStored(key, t.medium(), t.locality()));
      }
    }
  }
  for (const auto& [block, count] : open) {
    if (count <= 0) continue;
    const auto& [group, hash, residency] = block;
    removals.Add(Medium::kStorage, group, residency, hash, count);
  }
  const uint64_t announced_chunks = stores.size();
  const uint64_t removed_blocks = removals.blocks() - cpu_blocks;
  for (KvEvent& e : stores) events.push_back(std::move(e));

  KVO_LOG_INFO(
      "offload manager: recovered from {} journal batches: {} CPU blocks removed, {} storage "
      "blocks removed, {} chunks announced",
      journaled.batches(), cpu_blocks, removed_blocks, announced_chunks);
  KVO_RETURN_IF_ERROR(m.SendBatch(std::move(events)));
  return manager;
}

}  // namespace kvo
