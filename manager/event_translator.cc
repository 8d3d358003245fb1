#include "manager/event_translator.h"

#include <utility>

namespace kvo {

void EventTranslator::Record(const OffloadKey& key, BlockStored chunk, bool overwrite) {
  if (!self_describing_) return;
  Entry& e = entries_[key];
  if (e.meta.has_value() && !overwrite) return;
  // A key announced in self-describing form keeps the metadata its removal must repeat.
  if (e.described_tiers != 0 && e.meta.has_value()) return;
  e.meta = std::move(chunk);
}

void EventTranslator::ForgetUnannounced(const OffloadKey& key) {
  auto it = entries_.find(key);
  if (it != entries_.end() && it->second.described_tiers == 0) entries_.erase(it);
}

void EventTranslator::Adopt(const OffloadKey& key, BlockStored chunk, int32_t tier) {
  if (!self_describing_) return;
  Entry& e = entries_[key];
  if (!e.meta.has_value()) e.meta = std::move(chunk);
  e.described_tiers |= Bit(tier);
}

BlockStored EventTranslator::PlaceholderStored(const OffloadKey& key, Medium medium,
                                               const std::optional<std::string>& locality) {
  BlockStored s;
  s.block_hashes.push_back(key.EventHash());
  s.block_size = 0;
  s.medium = std::string(MediumName(medium));
  s.group_idx = key.group();
  s.locality = locality;
  return s;
}

BlockStored EventTranslator::DescribedStored(const OffloadKey& key, BlockStored chunk,
                                             Medium medium,
                                             const std::optional<std::string>& locality) {
  chunk.medium = std::string(MediumName(medium));
  chunk.group_idx = key.group();
  chunk.locality = locality;
  return chunk;
}

void EventTranslator::Translate(const OffloadingEvent& event, std::vector<KvEvent>* out) {
  if (event.keys.empty()) return;
  const uint64_t bit = Bit(event.tier);
  if (!event.removed()) {
    for (const OffloadKey& key : event.keys) {
      if (self_describing_) {
        auto it = entries_.find(key);
        if (it != entries_.end() && it->second.meta.has_value() &&
            !it->second.meta->block_hashes.empty()) {
          it->second.described_tiers |= bit;
          out->emplace_back(DescribedStored(key, *it->second.meta, event.medium, event.locality));
          continue;
        }
      }
      out->emplace_back(PlaceholderStored(key, event.medium, event.locality));
    }
    return;
  }
  // Removal: one BlockRemoved per group, in order of first appearance.
  groups_.clear();
  for (const OffloadKey& key : event.keys) {
    size_t index = out->size();
    for (const auto& [group, at] : groups_) {
      if (group == key.group()) {
        index = at;
        break;
      }
    }
    if (index == out->size()) {
      BlockRemoved r;
      r.medium = std::string(MediumName(event.medium));
      r.group_idx = key.group();
      r.locality = event.locality;
      if (event.reason() != RemovalReason::kNone)
        r.reason = std::string(RemovalReasonName(event.reason()));
      out->emplace_back(std::move(r));
      groups_.emplace_back(key.group(), index);
    }
    auto& removed = std::get<BlockRemoved>((*out)[index]);
    bool described = false;
    if (self_describing_) {
      auto it = entries_.find(key);
      if (it != entries_.end()) {
        Entry& e = it->second;
        if ((e.described_tiers & bit) != 0 && e.meta.has_value()) {
          described = true;
          removed.block_hashes.insert(removed.block_hashes.end(), e.meta->block_hashes.begin(),
                                      e.meta->block_hashes.end());
        }
        e.described_tiers &= ~bit;
        if (e.described_tiers == 0) entries_.erase(it);  // vLLM pops the snapshot on removal
      }
    }
    if (!described) removed.block_hashes.push_back(key.EventHash());
  }
}

void EventTranslator::AnnouncedHashes(const OffloadKey& key, int32_t tier,
                                      std::vector<uint64_t>* out) const {
  if (self_describing_) {
    auto it = entries_.find(key);
    if (it != entries_.end() && (it->second.described_tiers & Bit(tier)) != 0 &&
        it->second.meta.has_value()) {
      for (const BlockHash& h : it->second.meta->block_hashes) out->push_back(h.Low64());
      return;
    }
  }
  out->push_back(key.Wire());
}

}  // namespace kvo
