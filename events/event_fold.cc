#include "events/event_fold.h"

#include <algorithm>
#include <tuple>

namespace kvo {
namespace {

template <typename T>
uint32_t Intern(std::vector<T>* table, const T& value) {
  auto it = std::find(table->begin(), table->end(), value);
  if (it != table->end()) return static_cast<uint32_t>(it - table->begin());
  table->push_back(value);
  return static_cast<uint32_t>(table->size() - 1);
}

}  // namespace

KvEventFold::KvEventFold()
    : media_{kMediumGpu}, residencies_{std::string()}, owners_{std::string()} {
  counts_.max_load_factor(0.5f);
}

size_t KvEventFold::KeyHash::operator()(const Key& k) const {
  uint64_t h = k.hash ^ (static_cast<uint64_t>(k.group) * 0x9e3779b97f4a7c15ULL) ^
               (static_cast<uint64_t>(k.stream) << 40) ^ (static_cast<uint64_t>(k.medium) << 20) ^
               k.residency ^ (static_cast<uint64_t>(k.ownership) << 8);
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  return static_cast<size_t>(h);
}

uint32_t KvEventFold::StreamId(const EventStream& stream) {
  // Few streams per fold (one per publisher rank): a linear scan of the last one first.
  if (!streams_.empty() && streams_.back() == stream) {
    return static_cast<uint32_t>(streams_.size() - 1);
  }
  return Intern(&streams_, stream);
}

std::optional<uint32_t> KvEventFold::FindStream(const EventStream& stream) const {
  auto it = std::find(streams_.begin(), streams_.end(), stream);
  if (it == streams_.end()) return std::nullopt;
  return static_cast<uint32_t>(it - streams_.begin());
}

uint32_t KvEventFold::MediumId(const std::optional<std::string>& medium) {
  if (!medium.has_value()) return 0;  // GPU
  return Intern(&media_, *medium);
}

uint32_t KvEventFold::ResidencyId(const std::optional<std::string>& locality) {
  if (!locality.has_value()) return 0;
  // An explicit empty locality is kept apart from an unset one.
  for (size_t i = 1; i < residencies_.size(); ++i) {
    if (residencies_[i] == *locality) return static_cast<uint32_t>(i);
  }
  residencies_.push_back(*locality);
  return static_cast<uint32_t>(residencies_.size() - 1);
}

uint32_t KvEventFold::OwnershipId(const std::optional<std::string>& ownership) {
  if (!ownership.has_value() || ownership->empty()) return 0;
  return Intern(&owners_, *ownership);
}

void KvEventFold::Apply(const EventStream& stream, const EventBatch& batch) {
  ++batches_;
  for (const KvEvent& e : batch.events) Apply(stream, e);
}

template <typename Event>
KvEventFold::Key KvEventFold::KeyOf(uint32_t stream, const Event& e) {
  return Key{stream,
             MediumId(e.medium),
             ResidencyId(e.locality),
             OwnershipId(e.ownership),
             e.group_idx.value_or(0),
             0};
}

void KvEventFold::Apply(const EventStream& stream, const KvEvent& event) {
  const uint32_t sid = StreamId(stream);
  if (const auto* s = std::get_if<BlockStored>(&event)) {
    Key k = KeyOf(sid, *s);
    for (const BlockHash& h : s->block_hashes) {
      k.hash = h.Low64();
      ++counts_[k];
    }
    return;
  }
  if (const auto* r = std::get_if<BlockRemoved>(&event)) {
    Key k = KeyOf(sid, *r);
    for (const BlockHash& h : r->block_hashes) {
      k.hash = h.Low64();
      auto it = counts_.find(k);
      if (it == counts_.end()) {
        ++unknown_removals_;
        continue;
      }
      if (--it->second == 0) counts_.erase(it);
    }
    return;
  }
  // AllBlocksCleared: the stream's GPU entries (medium id 0) that no tier owns, nothing else.
  std::erase_if(counts_, [sid](const auto& kv) {
    return kv.first.stream == sid && kv.first.medium == 0 && kv.first.ownership == 0;
  });
}

void KvEventFold::ClearStream(const EventStream& stream) {
  const std::optional<uint32_t> sid = FindStream(stream);
  if (!sid.has_value()) return;
  std::erase_if(counts_, [&](const auto& kv) { return kv.first.stream == *sid; });
}

void KvEventFold::ClearSource(std::string_view source) {
  std::erase_if(counts_,
                [&](const auto& kv) { return streams_[kv.first.stream].source == source; });
}

FoldEntry KvEventFold::EntryOf(const Key& k, int64_t count) const {
  FoldEntry e;
  e.stream = streams_[k.stream];
  e.medium = media_[k.medium];
  e.group = k.group;
  e.hash = k.hash;
  if (k.residency != 0) e.residency = residencies_[k.residency];
  e.ownership = owners_[k.ownership];
  e.refcount = count;
  return e;
}

std::vector<FoldEntry> KvEventFold::Entries() const {
  std::vector<FoldEntry> out;
  out.reserve(counts_.size());
  for (const auto& [k, n] : counts_) out.push_back(EntryOf(k, n));
  std::sort(out.begin(), out.end(), [](const FoldEntry& a, const FoldEntry& b) {
    return std::tie(a.stream, a.medium, a.group, a.hash, a.residency, a.ownership) <
           std::tie(b.stream, b.medium, b.group, b.hash, b.residency, b.ownership);
  });
  return out;
}

BlockCounts KvEventFold::ByBlock(std::optional<std::string_view> medium) const {
  BlockCounts out;
  for (const auto& [k, n] : counts_) {
    if (medium.has_value() && media_[k.medium] != *medium) continue;
    out[BlockId{streams_[k.stream], media_[k.medium], k.group, k.hash}] += n;
  }
  return out;
}

int64_t KvEventFold::Count(const EventStream& stream, std::string_view medium, int64_t group,
                           uint64_t hash, const std::optional<std::string>& residency) const {
  const std::optional<uint32_t> sid = FindStream(stream);
  if (!sid.has_value()) return 0;
  auto m = std::find(media_.begin(), media_.end(), medium);
  if (m == media_.end()) return 0;
  uint32_t rid = 0;
  if (residency.has_value()) {
    auto r = std::find(residencies_.begin() + 1, residencies_.end(), *residency);
    if (r == residencies_.end()) return 0;
    rid = static_cast<uint32_t>(r - residencies_.begin());
  }
  auto it = counts_.find(Key{*sid, static_cast<uint32_t>(m - media_.begin()), rid, 0, group, hash});
  return it == counts_.end() ? 0 : it->second;
}

uint64_t DigestOf(const BlockCounts& counts) {
  uint64_t h = 0xcbf29ce484222325ULL;
  auto mix = [&h](const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) {
      h ^= p[i];
      h *= 0x100000001b3ULL;
    }
  };
  for (const auto& [id, n] : counts) {
    const uint64_t source_len = id.stream.source.size();
    mix(&source_len, sizeof source_len);
    mix(id.stream.source.data(), id.stream.source.size());
    mix(&id.stream.dp_rank, sizeof id.stream.dp_rank);
    const uint64_t medium_len = id.medium.size();
    mix(&medium_len, sizeof medium_len);
    mix(id.medium.data(), id.medium.size());
    mix(&id.group, sizeof id.group);
    mix(&id.hash, sizeof id.hash);
    mix(&n, sizeof n);
  }
  return h;
}

}  // namespace kvo
