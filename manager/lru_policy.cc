#include "manager/lru_policy.h"

#include <string>

#include "common/check.h"

namespace kvo {

using policy_internal::kNil;
using policy_internal::kNoList;
using policy_internal::Node;

LruPolicy::LruPolicy(size_t capacity) : table_(/*num_lists=*/1, capacity) {}

BlockStatus* LruPolicy::Get(const OffloadKey& key) {
  const uint32_t i = table_.Find(key);
  return i == kNil ? nullptr : &table_.at(i).status;
}

void LruPolicy::Insert(const OffloadKey& key, BlockStatus block) {
  uint64_t hash = 0;
  uint32_t i = table_.Find(key, &hash);
  KVO_DCHECK(i == kNil);  // REQUIRES: absent
  if (i == kNil) i = table_.Add(key, hash);
  // Like vLLM's `blocks[key] = block; if ref_cnt == 0: evictable[key] = None`.
  table_.at(i).status = block;
  if (block.ref_cnt == 0 && table_.ListOf(i) != kEvictable) table_.PushBack(kEvictable, i);
}

void LruPolicy::Remove(const OffloadKey& key) {
  const uint32_t i = table_.Find(key);
  if (i == kNil) return;
  if (table_.ListOf(i) == kEvictable) table_.Unlink(i);
  table_.Erase(i);
}

void LruPolicy::Touch(std::span<const OffloadKey> keys) {
  for (size_t k = keys.size(); k-- > 0;) {
    const uint32_t i = table_.Find(keys[k]);
    if (i != kNil && table_.ListOf(i) == kEvictable) table_.MoveToBack(kEvictable, i);
  }
}

std::optional<std::vector<std::pair<OffloadKey, BlockStatus>>> LruPolicy::Evict(
    size_t n, std::span<const OffloadKey> protected_keys) {
  std::vector<std::pair<OffloadKey, BlockStatus>> out;
  if (!EvictInto(n, protected_keys, &out)) return std::nullopt;
  return out;
}

bool LruPolicy::EvictInto(size_t n, std::span<const OffloadKey> protected_keys,
                          std::vector<std::pair<OffloadKey, BlockStatus>>* out) {
  out->clear();
  if (n == 0) return true;
  if (n > table_.ListSize(kEvictable)) return false;
  victims_.clear();
  if (protected_keys.empty()) {
    for (uint32_t i = table_.Front(kEvictable); victims_.size() < n; i = table_.Next(i))
      victims_.push_back(i);
  } else {
    protected_.Reset(table_, protected_keys);
    for (uint32_t i = table_.Front(kEvictable); i != kEvictable; i = table_.Next(i)) {
      if (protected_.Contains(i)) continue;
      victims_.push_back(i);
      if (victims_.size() == n) break;
    }
    protected_.Clear();
    if (victims_.size() < n) return false;
  }
  // Start every victim's index miss before erasing any.
  hashes_.resize(n);
  for (size_t k = 0; k < n; ++k) {
    hashes_[k] = table_.at(victims_[k]).Hash();
    table_.Prefetch(hashes_[k]);
  }
  out->reserve(n);
  for (size_t k = 0; k < n; ++k) {
    const uint32_t i = victims_[k];
    const Node& node = table_.at(i);
    out->emplace_back(node.Key(), node.status);
    table_.Unlink(i);
    table_.Erase(i, hashes_[k]);
  }
  return true;
}

void LruPolicy::Clear() { table_.Clear(); }

void LruPolicy::MarkEvictable(const OffloadKey& key) {
  const uint32_t i = table_.Find(key);
  if (i != kNil && table_.ListOf(i) != kEvictable) table_.PushBack(kEvictable, i);
}

void LruPolicy::MarkNonEvictable(const OffloadKey& key) {
  const uint32_t i = table_.Find(key);
  if (i != kNil && table_.ListOf(i) == kEvictable) table_.Unlink(i);
}

Status LruPolicy::CheckInvariants() const {
  KVO_RETURN_IF_ERROR(table_.CheckStructure());
  Status bad;
  size_t zero = 0;
  table_.ForEach([&](uint32_t i) {
    if (!bad.ok()) return;
    const Node& n = table_.at(i);
    const bool listed = n.list() == kEvictable;
    if (n.status.ref_cnt == 0) ++zero;
    if (listed != (n.status.ref_cnt == 0)) {
      bad = Status::Internal("lru: block " + n.Key().Hex() + " has ref_cnt " +
                             std::to_string(n.status.ref_cnt) +
                             (listed ? " but is evictable" : " but is not evictable"));
    }
    if (!listed && n.list() != kNoList) bad = Status::Internal("lru: bad list id");
  });
  KVO_RETURN_IF_ERROR(bad);
  if (zero != table_.ListSize(kEvictable)) {
    return Status::Internal("lru: evictable list size " +
                            std::to_string(table_.ListSize(kEvictable)) + " but " +
                            std::to_string(zero) + " blocks have ref_cnt 0");
  }
  return Status::Ok();
}

std::vector<OffloadKey> LruPolicy::EvictableKeys() const {
  std::vector<OffloadKey> out;
  out.reserve(table_.ListSize(kEvictable));
  for (uint32_t i = table_.Front(kEvictable); i != kEvictable; i = table_.Next(i))
    out.push_back(table_.at(i).Key());
  return out;
}

std::unique_ptr<CachePolicy> NewLruPolicy(size_t capacity) {
  return std::make_unique<LruPolicy>(capacity);
}

}  // namespace kvo
