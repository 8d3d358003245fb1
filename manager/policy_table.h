// NodeTable: the storage shared by the built-in cache policies (LRU, ARC). Internal to manager/.
//
// One 52-byte node per key, in a slab addressed by uint32 index, plus a flat open-addressing
// index from key to node, plus up to four intrusive doubly-linked lists threaded through the
// nodes by index. No per-key heap allocation; a node's address never changes while its key is in
// the table (the slab grows by whole segments, never by moving nodes), so `BlockStatus*` handed
// out by Get stays valid until that key is erased.
//
// Node layout (52 bytes, 4-byte aligned):
//   digest[32]  the key's digest, zero padded     group   the key's group
//   status      BlockStatus {ref_cnt, slot}       w0/w1   prev, next (28 bits each), list id
//                                                         (2 bits), digest length (6 bits)
// Index: `uint32` slots, Robin Hood linear probing from home = fastrange(hash >> 32). A slot holds
// the node index (low bits; 0 = empty, node 0 being a sentinel), its distance from home (6 bits)
// and a tag of the hash's low bits (the rest), so that probing, Robin Hood displacement and
// backward-shift deletion read no node except on a tag match. A distance of 63 or more is stored
// as 63 and recomputed from the node when needed (only long runs of colliding hashes get there;
// they stay correct, just slower). Sized for `expected_keys` at load <= 0.75; grows x2 past
// 0.875.
// Memory at the expected size: 52 + ~5.3 bytes per key. Arrays of 4 MiB or more are 2 MiB
// aligned and advised MADV_HUGEPAGE (fewer TLB misses on the two random reads of a lookup).
//
// A one-entry memo remembers the last key found or added, so the manager's usual pairs (Get
// then MarkEvictable, Insert then Get) hash and probe once; and 64 recently found or added nodes,
// direct-mapped by the hash's top bits, let complete_store find the keys prepare_store just
// inserted without probing the index (+10 % stored blocks/s). Erase clears the entries of the node
// it frees, so both only ever name live nodes (CheckStructure checks it).
//
// Lists: list L's sentinel is node L (L < num_lists); iteration runs Front(L) .. L, LRU -> MRU.
// A node that is in no list has list id kNoList (a table with four lists cannot tell list 3 from
// no list; such callers keep every node in a list).
//
// Invariants (CheckStructure): every list is a well-formed cycle through its sentinel whose nodes
// carry its id and whose length is ListSize; every indexed node is live, its slot's tag and
// distance match its hash, and Find reaches it; live + free + sentinels == slab high water; every
// listed node is indexed.
//
// Thread-compatible (const methods write nothing); the policy's caller serialises every call.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "manager/cache_policy.h"
#include "manager/offload_key.h"

namespace kvo::policy_internal {

inline constexpr uint32_t kIndexBits = 28;
inline constexpr uint32_t kNil = (1u << kIndexBits) - 1;  // "no node"; node indices are < kNil
inline constexpr uint32_t kIndexMask = kNil;
inline constexpr uint32_t kNoList = 3;

// Loads 8 bytes (unaligned).
inline uint64_t Load64(const uint8_t* p) {
  uint64_t w;
  std::memcpy(&w, p, 8);
  return w;
}

// 64x64 -> 128-bit multiply, folded (both halves mixed).
__extension__ using Uint128 = unsigned __int128;  // GCC and clang, 64-bit targets
inline uint64_t MulFold(uint64_t a, uint64_t b) {
  const Uint128 p = static_cast<Uint128>(a) * b;
  return static_cast<uint64_t>(p) ^ static_cast<uint64_t>(p >> 64);
}

// A key's hash from its parts (so nodes and OffloadKeys hash alike without building a key).
// `digest` points at kMaxHashBytes bytes, zero past `len` (OffloadKey and Node both keep that
// padding), so the hash reads all 32 bytes without branching: two independent 128-bit multiplies.
// The group and length enter through the first word (a key's first 8 digest bytes XOR
// (group << 8) XOR len), which tests rely on to craft colliding keys.
inline uint64_t HashKeyParts(const uint8_t* digest, size_t len, uint32_t group) {
  const uint64_t x0 = Load64(digest) ^ (uint64_t{group} << 8) ^ len ^ 0x9e3779b97f4a7c15ULL;
  const uint64_t a = MulFold(x0, Load64(digest + 8) ^ 0xe7037ed1a0b428dbULL);
  const uint64_t b = MulFold(Load64(digest + 16) ^ 0x8ebc6af09c88c6e3ULL,
                             Load64(digest + 24) ^ 0x589965cc75374cc3ULL);
  return a ^ b;
}

inline uint64_t HashKey(const OffloadKey& key) {
  return HashKeyParts(key.padded_bytes(), key.digest().size(), key.group());
}

struct Node {
  uint8_t digest[OffloadKey::kMaxHashBytes] = {};
  uint32_t group = 0;
  BlockStatus status;
  uint32_t w0 = 0;  // bits 0-27 prev, 28-29 list id, 30-31 digest length bits 0-1
  uint32_t w1 = 0;  // bits 0-27 next, 28-31 digest length bits 2-5

  uint32_t prev() const { return w0 & kIndexMask; }
  uint32_t next() const { return w1 & kIndexMask; }
  uint32_t list() const { return (w0 >> kIndexBits) & 3u; }
  size_t len() const { return (w0 >> 30) | ((w1 >> kIndexBits) << 2); }
  void set_prev(uint32_t p) { w0 = (w0 & ~kIndexMask) | p; }
  void set_next(uint32_t n) { w1 = (w1 & ~kIndexMask) | n; }
  void set_list(uint32_t l) { w0 = (w0 & ~(3u << kIndexBits)) | (l << kIndexBits); }
  void set_len(size_t len) {
    uint32_t l = static_cast<uint32_t>(len);
    w0 = (w0 & ~(3u << 30)) | ((l & 3u) << 30);
    w1 = (w1 & kIndexMask) | ((l >> 2) << kIndexBits);
  }
  uint64_t Hash() const { return HashKeyParts(digest, len(), group); }
  bool Equals(const OffloadKey& key) const {
    // Both sides are zero padded to 32 bytes: compare everything without branching.
    const uint8_t* k = key.padded_bytes();
    const uint64_t diff = (Load64(digest) ^ Load64(k)) | (Load64(digest + 8) ^ Load64(k + 8)) |
                          (Load64(digest + 16) ^ Load64(k + 16)) |
                          (Load64(digest + 24) ^ Load64(k + 24)) | (group ^ key.group()) |
                          (len() ^ key.digest().size());
    return diff == 0;
  }
  OffloadKey Key() const {
    return OffloadKey::FromDigest(std::string_view(reinterpret_cast<const char*>(digest), len()),
                                  group);
  }
};
static_assert(sizeof(Node) == 52, "a node is 52 bytes");

class NodeTable {
 public:
  // `num_lists` in [1, 4]; room for `expected_keys` keys without growing.
  NodeTable(uint32_t num_lists, size_t expected_keys);
  ~NodeTable();
  NodeTable(const NodeTable&) = delete;
  NodeTable& operator=(const NodeTable&) = delete;

  // The key's node, or kNil. On a miss, `*hash` (when given) receives the key's hash for Add.
  // Updates the memo, so it is not const; FindConst is the read-only form.
  uint32_t Find(const OffloadKey& key, uint64_t* hash = nullptr) {
    if (memo_ != kNil && at(memo_).Equals(key)) return memo_;
    const uint64_t h = HashKey(key);
    const uint32_t r = recent_[RecentSlot(h)];
    if (r != kNil && at(r).Equals(key)) return memo_ = r;
    const uint32_t i = FindHashed(key, h);
    if (i != kNil) {
      memo_ = i;
      recent_[RecentSlot(h)] = i;
    } else if (hash != nullptr) {
      *hash = h;
    }
    return i;
  }
  uint32_t FindConst(const OffloadKey& key) const { return FindHashed(key, HashKey(key)); }
  // The status of a key whose node is in a list <= max_list (the policy's cached lists), else
  // nullptr. Read-only, no memo: the manager's lookup path.
  const BlockStatus* PeekStatus(const OffloadKey& key, uint32_t max_list) const {
    return PeekStatus(key, HashKey(key), max_list);
  }
  // The same with the key's hash (REQUIRES: hash == HashKey(key)).
  const BlockStatus* PeekStatus(const OffloadKey& key, uint64_t hash, uint32_t max_list) const {
    const uint32_t i = FindHashed(key, hash);
    if (i == kNil) return nullptr;
    const Node& n = at(i);
    return n.list() <= max_list ? &n.status : nullptr;
  }
  // Adds an absent key whose hash is `hash` (REQUIRES: Find(key) == kNil); the node is in no
  // list, status default.
  uint32_t Add(const OffloadKey& key, uint64_t hash);
  // Drops a node that is in no list (REQUIRES: unlinked) from the index and frees it.
  void Erase(uint32_t i) { Erase(i, at(i).Hash()); }
  // The same, given the node's hash.
  void Erase(uint32_t i, uint64_t hash);
  // Starts loading the index slots a key with this hash probes first (batch erases overlap
  // their cache misses this way).
  void Prefetch(uint64_t hash) const { __builtin_prefetch(&slots_[Home(hash)]); }
  // Starts loading the node of the first slot near home whose tag matches (reads only index
  // slots, which an earlier Prefetch(hash) brought in; never the nodes): the second miss of a
  // lookup, started early. A hint only: no effect on the table.
  void PrefetchNode(uint64_t hash) const {
    uint32_t pos = Home(hash);
    const uint32_t tag = static_cast<uint32_t>(hash) & tag_mask_;
    for (int d = 0; d < 4; ++d) {
      const uint32_t s = slots_[pos];
      const uint32_t i = s & idx_mask_;
      if (i == 0) return;
      if ((s & tag_mask_) == tag) {
        const char* n = reinterpret_cast<const char*>(&at(i));
        __builtin_prefetch(n);
        __builtin_prefetch(n + sizeof(Node) - 1);  // a node may straddle two lines
        return;
      }
      if (++pos == num_slots_) pos = 0;
    }
  }
  // Forgets every key; keeps the memory.
  void Clear();
  size_t size() const { return count_; }

  Node& at(uint32_t i) {
    if (i < seg0_size_) [[likely]]
      return seg0_[i];
    return OverflowAt(i);
  }
  const Node& at(uint32_t i) const { return const_cast<NodeTable*>(this)->at(i); }

  uint32_t ListOf(uint32_t i) const { return at(i).list(); }
  uint32_t ListSize(uint32_t list) const { return list_size_[list]; }
  // First node (LRU end) of `list`; equals `list` (its sentinel) when empty.
  uint32_t Front(uint32_t list) const { return at(list).next(); }
  uint32_t Next(uint32_t i) const { return at(i).next(); }
  void PushBack(uint32_t list, uint32_t i);
  void Unlink(uint32_t i);
  void MoveToBack(uint32_t list, uint32_t i) {
    Unlink(i);
    PushBack(list, i);
  }

  // Calls fn(node index) for every indexed key, in table order.
  template <class Fn>
  void ForEach(Fn fn) const {
    for (uint32_t s = 0; s < num_slots_; ++s) {
      uint32_t i = slots_[s] & idx_mask_;
      if (i != 0) fn(i);
    }
  }

  // Internal when the slab, index or lists are inconsistent (see the header comment).
  Status CheckStructure() const;

 private:
  static constexpr uint32_t kChunkShift = 12;
  static constexpr uint32_t kChunkSize = 1u << kChunkShift;

  static constexpr uint32_t kDistBits = 6;
  static constexpr uint32_t kMaxDist = (1u << kDistBits) - 1;

  uint32_t FindHashed(const OffloadKey& key, uint64_t h) const {
    uint32_t pos = Home(h);
    const uint32_t tag = static_cast<uint32_t>(h) & tag_mask_;
    for (uint32_t d = 0;; ++d) {
      const uint32_t s = slots_[pos];
      const uint32_t i = s & idx_mask_;
      // Empty, or a key nearer its home than we are to ours (Robin Hood): absent. A saturated
      // distance means "kMaxDist or more" and never ends the probe.
      if (i == 0 || (Dist(s) < d && Dist(s) < kMaxDist)) return kNil;
      if ((s & tag_mask_) == tag && at(i).Equals(key)) return i;
      if (++pos == num_slots_) pos = 0;
    }
  }
  // The slot's stored distance from home, saturated at kMaxDist.
  uint32_t Dist(uint32_t s) const { return (s >> dist_shift_) & kMaxDist; }
  // The true distance of the entry in slot `pos` (reads the node only when saturated).
  uint32_t TrueDist(uint32_t s, uint32_t pos) const {
    const uint32_t d = Dist(s);
    if (d < kMaxDist) [[likely]]
      return d;
    const uint32_t home = Home(at(s & idx_mask_).Hash());
    return pos >= home ? pos - home : pos + num_slots_ - home;
  }
  uint32_t WithDist(uint32_t s, uint32_t d) const {
    return (s & ~(kMaxDist << dist_shift_)) | (std::min(d, kMaxDist) << dist_shift_);
  }
  uint32_t Home(uint64_t h) const {
    return static_cast<uint32_t>(((h >> 32) * uint64_t{num_slots_}) >> 32);
  }
  Node& OverflowAt(uint32_t i);
  uint32_t AllocNode();
  void InitSentinels();
  // Resizes the index to `num_slots` slots (re-deriving masks) and reinserts every key.
  void Rehash(uint32_t num_slots);
  // Robin Hood insertion of node i, whose hash is h.
  void Place(uint32_t i, uint64_t h);

  const uint32_t num_lists_;
  // Slab: nodes [0, seg0_size_) in seg0_, then kChunkSize-node chunks.
  Node* seg0_ = nullptr;
  uint32_t seg0_size_ = 0;
  std::vector<Node*> chunks_;
  uint32_t high_water_ = 0;  // nodes [0, high_water_) have been constructed
  uint32_t free_head_ = kNil;
  uint32_t num_free_ = 0;
  uint32_t list_size_[4] = {0, 0, 0, 0};

  // Index.
  struct FreeSlots {
    void operator()(uint32_t* p) const { std::free(p); }
  };
  using SlotArray = std::unique_ptr<uint32_t[], FreeSlots>;
  SlotArray slots_;
  uint32_t num_slots_ = 0;
  uint32_t idx_mask_ = 0;
  uint32_t dist_shift_ = 0;
  uint32_t tag_mask_ = 0;
  size_t count_ = 0;
  size_t grow_at_ = 0;    // grow before the count exceeds this
  uint32_t memo_ = kNil;  // the last node found or added (a live node) or kNil
  // Recently found or added nodes, direct-mapped by hash bits: a key inserted by prepare_store is
  // found again by complete_store without probing the index. Entries are live nodes or kNil.
  static constexpr uint32_t kRecentBits = 6;
  static uint32_t RecentSlot(uint64_t h) { return static_cast<uint32_t>(h >> (64 - kRecentBits)); }
  uint32_t recent_[1u << kRecentBits] = {};  // filled with kNil by the constructor
};

// Implemented by the built-in policies so that the manager's lookup probes their table directly
// (no virtual call, no memo update): a key is cached when its node's list is <= max_cached_list().
// PeekStatus(key, max_cached_list()) must equal Get(key) at every moment.
class TableBackedPolicy {
 public:
  virtual ~TableBackedPolicy() = default;
  virtual const NodeTable& table() const = 0;
  virtual uint32_t max_cached_list() const = 0;
};

// The protected keys of one Evict call, as the node indices of those present in the table (an
// absent key cannot be a victim). Contains(node) is a scan of at most kLinearMax ids or a binary
// search; no allocation once warm.
class ProtectedSet {
 public:
  void Reset(const NodeTable& table, std::span<const OffloadKey> keys);
  void Clear() { ids_.clear(); }
  bool Contains(uint32_t node) const {
    if (ids_.size() <= kLinearMax) {
      bool found = false;
      for (uint32_t id : ids_) found |= id == node;
      return found;
    }
    return std::binary_search(ids_.begin(), ids_.end(), node);
  }

 private:
  static constexpr size_t kLinearMax = 16;
  std::vector<uint32_t> ids_;
};

}  // namespace kvo::policy_internal
