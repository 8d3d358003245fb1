#include "manager/arc_policy.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "common/check.h"

namespace kvo {

using policy_internal::kNil;
using policy_internal::Node;

ArcPolicy::ArcPolicy(size_t capacity, ArcOptions options)
    : capacity_(capacity), options_(options), table_(/*num_lists=*/4, capacity) {}

BlockStatus* ArcPolicy::Get(const OffloadKey& key) {
  const uint32_t i = table_.Find(key);
  if (i == kNil) return nullptr;
  Node& n = table_.at(i);
  return n.list() <= kT2 ? &n.status : nullptr;
}

void ArcPolicy::Insert(const OffloadKey& key, BlockStatus block) {
  uint64_t hash = 0;
  uint32_t i = table_.Find(key, &hash);
  if (i == kNil) {
    i = table_.Add(key, hash);
  } else {
    const uint32_t list = table_.ListOf(i);
    if (list <= kT2) {
      // REQUIRES: not cached. Released builds overwrite in place, like `t1[key] = block`.
      KVO_DCHECK(false);
      Node& n = table_.at(i);
      if (n.status.ref_cnt == 0) --num_evictable_;
      n.status = block;
      if (block.ref_cnt == 0) ++num_evictable_;
      return;
    }
    table_.Unlink(i);  // a ghost comes back: it leaves B1 / B2
  }
  table_.at(i).status = block;
  table_.PushBack(kT1, i);
  if (block.ref_cnt == 0) ++num_evictable_;
}

void ArcPolicy::Remove(const OffloadKey& key) {
  const uint32_t i = table_.Find(key);
  if (i == kNil || table_.ListOf(i) > kT2) return;
  if (table_.at(i).status.ref_cnt == 0) --num_evictable_;
  table_.Unlink(i);
  table_.Erase(i);
}

void ArcPolicy::Touch(std::span<const OffloadKey> keys) {
  for (size_t k = keys.size(); k-- > 0;) {
    const uint32_t i = table_.Find(keys[k]);
    if (i == kNil) continue;
    switch (table_.ListOf(i)) {
      case kT1:
        // A block still being written was only prepared, not used twice: it stays in T1.
        table_.MoveToBack(table_.at(i).status.ready() ? kT2 : kT1, i);
        break;
      case kT2:
        table_.MoveToBack(kT2, i);
        break;
      case kB1: {
        const double delta = std::max(1.0, static_cast<double>(table_.ListSize(kB2)) /
                                               static_cast<double>(table_.ListSize(kB1)));
        target_t1_size_ = std::min(target_t1_size_ + delta, static_cast<double>(capacity_));
        table_.MoveToBack(kB1, i);
        break;
      }
      default: {  // kB2
        const double delta = std::max(1.0, static_cast<double>(table_.ListSize(kB1)) /
                                               static_cast<double>(table_.ListSize(kB2)));
        target_t1_size_ = std::max(target_t1_size_ - delta, 0.0);
        table_.MoveToBack(kB2, i);
        break;
      }
    }
  }
}

std::optional<std::vector<std::pair<OffloadKey, BlockStatus>>> ArcPolicy::Evict(
    size_t n, std::span<const OffloadKey> protected_keys) {
  std::vector<std::pair<OffloadKey, BlockStatus>> out;
  if (!EvictInto(n, protected_keys, &out)) return std::nullopt;
  return out;
}

bool ArcPolicy::EvictInto(size_t n, std::span<const OffloadKey> protected_keys,
                          std::vector<std::pair<OffloadKey, BlockStatus>>* out) {
  out->clear();
  if (n == 0) return true;
  protected_.Reset(table_, protected_keys);
  victims_.clear();

  // Monotonic cursors: each list is scanned at most once per call.
  uint32_t t1 = table_.Front(kT1);
  uint32_t t2 = table_.Front(kT2);
  auto next_candidate = [&](uint32_t& cursor, uint32_t list) -> uint32_t {
    while (cursor != list) {
      const uint32_t i = cursor;
      cursor = table_.Next(i);
      const Node& node = table_.at(i);
      if (node.status.ref_cnt == 0 && !protected_.Contains(i)) return i;
    }
    return kNil;
  };

  int64_t virtual_t1_size = table_.ListSize(kT1);
  const auto target = static_cast<int64_t>(target_t1_size_);  // Python's int(): truncation
  bool ok = true;
  while (victims_.size() < n) {
    if (virtual_t1_size >= target) {
      const uint32_t i = next_candidate(t1, kT1);
      if (i != kNil) {
        victims_.push_back({i, true});
        --virtual_t1_size;
        continue;
      }
    }
    const uint32_t i = next_candidate(t2, kT2);
    if (i != kNil) {
      victims_.push_back({i, false});
      continue;
    }
    const uint32_t j = options_.t1_fallback ? next_candidate(t1, kT1) : kNil;
    if (j == kNil) {
      ok = false;
      break;
    }
    victims_.push_back({j, true});
    --virtual_t1_size;
  }
  protected_.Clear();
  if (!ok) return false;

  out->reserve(n);
  for (const Victim& v : victims_) {
    const Node& node = table_.at(v.node);
    out->emplace_back(node.Key(), node.status);
    table_.MoveToBack(v.from_t1 ? kB1 : kB2, v.node);
  }
  num_evictable_ -= std::min(n, num_evictable_);  // every victim had ref_cnt 0
  for (uint32_t ghost : {kB1, kB2}) {
    // Oldest ghosts first; start their index misses before erasing any.
    const size_t size = table_.ListSize(ghost);
    const size_t excess = size > capacity_ ? size - capacity_ : 0;
    trimmed_.clear();
    for (uint32_t i = table_.Front(ghost); trimmed_.size() < excess; i = table_.Next(i)) {
      const uint64_t h = table_.at(i).Hash();
      table_.Prefetch(h);
      trimmed_.emplace_back(i, h);
    }
    for (const auto& [i, h] : trimmed_) {
      table_.Unlink(i);
      table_.Erase(i, h);
    }
  }
  return true;
}

void ArcPolicy::Clear() {
  table_.Clear();
  target_t1_size_ = 0.0;
  num_evictable_ = 0;
}

void ArcPolicy::MarkEvictable(const OffloadKey& key) {
  const uint32_t i = table_.Find(key);
  if (i != kNil && table_.ListOf(i) <= kT2) ++num_evictable_;
}

void ArcPolicy::MarkNonEvictable(const OffloadKey& key) {
  const uint32_t i = table_.Find(key);
  if (i != kNil && table_.ListOf(i) <= kT2 && num_evictable_ > 0) --num_evictable_;
}

Status ArcPolicy::CheckInvariants() const {
  KVO_RETURN_IF_ERROR(table_.CheckStructure());
  // One node per key and one list per node make the lists pairwise disjoint; check that every
  // indexed key is on the list its node names, and count.
  size_t zero = 0;
  for (uint32_t list : {kT1, kT2}) {
    for (uint32_t i = table_.Front(list); i != list; i = table_.Next(i))
      if (table_.at(i).status.ref_cnt == 0) ++zero;
  }
  size_t listed = 0;
  for (uint32_t list : {kT1, kT2, kB1, kB2}) listed += table_.ListSize(list);
  if (listed != table_.size()) {
    return Status::Internal("arc: " + std::to_string(table_.size()) + " keys but " +
                            std::to_string(listed) + " list entries");
  }
  if (table_.ListSize(kB1) > capacity_ || table_.ListSize(kB2) > capacity_) {
    return Status::Internal("arc: ghost list over capacity " + std::to_string(capacity_) +
                            ": |B1| " + std::to_string(table_.ListSize(kB1)) + ", |B2| " +
                            std::to_string(table_.ListSize(kB2)));
  }
  if (!(target_t1_size_ >= 0.0 && target_t1_size_ <= static_cast<double>(capacity_))) {
    return Status::Internal("arc: target_t1_size " + std::to_string(target_t1_size_) +
                            " outside [0, " + std::to_string(capacity_) + "]");
  }
  if (zero != num_evictable_) {
    return Status::Internal("arc: num_evictable " + std::to_string(num_evictable_) + " but " +
                            std::to_string(zero) + " cached blocks have ref_cnt 0");
  }
  return Status::Ok();
}

std::optional<ArcPolicy::List> ArcPolicy::Where(const OffloadKey& key) const {
  const uint32_t i = table_.FindConst(key);
  if (i == kNil) return std::nullopt;
  return static_cast<List>(table_.ListOf(i));
}

std::vector<OffloadKey> ArcPolicy::Keys(List list) const {
  const auto l = static_cast<uint32_t>(list);
  std::vector<OffloadKey> out;
  out.reserve(table_.ListSize(l));
  for (uint32_t i = table_.Front(l); i != l; i = table_.Next(i)) out.push_back(table_.at(i).Key());
  return out;
}

std::unique_ptr<CachePolicy> NewArcPolicy(size_t capacity, ArcOptions options) {
  return std::make_unique<ArcPolicy>(capacity, options);
}

}  // namespace kvo
