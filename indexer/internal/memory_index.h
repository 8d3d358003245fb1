// MemoryIndex: the in-memory scoring structure of kvo_indexer (internal; see indexer/DESIGN.md).
//
//   node      one distinct block, known by its engine hash (by_engine_) and, when content-keyed,
//             by its content key (by_content_); 32 bytes + a bit matrix row
//   bits      per node, per medium, one bit per instance: "this instance holds the node there"
//   holdings  (node, instance, medium, group) -> refcount and first sequence (16-byte slots)
//
// Scoring walks the query's blocks, ANDs the per-node instance bits into an "alive" mask and
// keeps the per-medium "alive and held here" masks; the per-instance counts change only by the
// bits that change from one block to the next, so one block costs a few word operations
// whatever the number of instances. Thread-compatible: Indexer guards it
// (readers shared, writers exclusive); Score's LRU touch is a relaxed atomic store.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "indexer/internal/flat_table.h"

namespace kvo::indexer_internal {

inline constexpr uint32_t kNoNode = UINT32_MAX;
// Registry bounds. Media cost memory in every node's bit row (slots grow x2 past 3), so the
// medium table is small: vLLM publishes GPU, CPU and a storage tier or two. Names are bounded
// because they are interned forever.
inline constexpr size_t kMaxInstances = 0xFFFF;
inline constexpr size_t kMaxMedia = 16;
inline constexpr size_t kMaxMediumNameBytes = 64;
inline constexpr size_t kMaxGroups = 0xFF;

struct ScoreCounts {
  uint32_t instance = 0;
  int64_t depth = 0;             // prefix blocks
  std::vector<int64_t> present;  // per medium id: blocks of the prefix on that medium
  std::vector<int64_t> best;     // per medium id: blocks whose best medium is this one
};

// A query's block keys in order, produced on demand: engine hashes given by the caller, or
// content keys chained from token ids (ContentKey), hashed only as far as the reader goes, so a
// scoring walk that stops early never hashes the rest and one that runs long overlaps the hashing
// with its memory misses. Reading key i computes every key before it. Thread-compatible.
class BlockKeys {
 public:
  static BlockKeys Given(std::span<const uint64_t> keys) {
    BlockKeys k;
    k.given_ = keys;
    k.size_ = keys.size();
    return k;
  }
  // REQUIRES: block_size > 0. `root`: ContentKeyRoot(lora name).
  static BlockKeys FromTokens(std::span<const int64_t> tokens, size_t block_size, uint64_t root);

  size_t size() const { return size_; }
  // REQUIRES: i < size().
  uint64_t operator[](size_t i) {
    if (!from_tokens_) return given_[i];
    // Refills double (64, 128, ...): few refills, and at most twice the keys the reader needed.
    if (i >= computed_.size()) Extend(std::min(size_, std::max(i + 1, 2 * computed_.size() + 64)));
    return computed_[i];
  }
  // The first n keys, contiguous (computing what is missing). REQUIRES: n <= size().
  const uint64_t* First(size_t n) {
    if (!from_tokens_) return given_.data();
    if (n > computed_.size()) Extend(n);
    return computed_.data();
  }
  // Every key (computing the rest).
  std::vector<uint64_t> All();

 private:
  void Extend(size_t n);

  bool from_tokens_ = false;
  std::span<const uint64_t> given_;
  std::span<const int64_t> tokens_;
  size_t block_size_ = 0;
  uint64_t parent_ = 0;  // the root
  size_t size_ = 0;
  std::vector<uint64_t> computed_;
};

struct HolderInfo {
  uint32_t instance = 0;
  uint32_t medium = 0;
  uint32_t group = 0;  // group id (see GroupValue)
  uint32_t refcount = 0;
  uint64_t since_seq = 0;
};

class TieredWalker;

class MemoryIndex {
 public:
  MemoryIndex();

  // ---- registries (ids are dense and never reused) ----
  uint32_t InstanceId(uint32_t source_id, int64_t dp_rank);  // creates
  uint32_t MediumId(const std::string& name);                // creates
  uint32_t GroupId(int64_t group);                           // creates
  // Lookups that never create (UINT32_MAX when absent): validate a batch before changing state.
  uint32_t FindInstance(uint32_t source_id, int64_t dp_rank) const;
  uint32_t FindMedium(const std::string& name) const;
  uint32_t FindGroup(int64_t group) const;
  size_t group_count() const { return groups_.size(); }
  size_t instance_count() const { return instances_.size(); }
  uint32_t InstanceSource(uint32_t inst) const { return instances_[inst].source_id; }
  int64_t InstanceRank(uint32_t inst) const { return instances_[inst].dp_rank; }
  const std::string& MediumName(uint32_t m) const { return media_[m]; }
  size_t medium_count() const { return media_.size(); }
  int64_t GroupValue(uint32_t g) const { return groups_[g]; }

  // ---- lookups ----
  uint32_t NodeByEngine(uint64_t engine_hash) const;
  uint32_t NodeByContent(uint64_t content_key) const;
  uint64_t NodeContentKey(uint32_t node) const { return nodes_[node].content_key; }
  uint64_t NodeEngineHash(uint32_t node) const { return nodes_[node].engine_hash; }
  int64_t NodeBlockSize(uint32_t node) const { return nodes_[node].block_size; }

  // ---- mutations ----
  // Adds `refcount` references (1 for an event). Returns true when the entry already existed
  // (a duplicate store). content_key 0: unknown. A node gains a content key it lacked; a
  // conflicting one is ignored (returns via *conflict).
  // *node_out (when given): the node that holds engine_hash.
  bool Store(uint32_t inst, uint32_t medium, uint32_t group, uint64_t engine_hash,
             uint64_t content_key, int64_t block_size, uint64_t seq, uint32_t refcount,
             bool* conflict, uint32_t* node_out = nullptr);
  // A hint for the walks: node `to` follows node `from` in a chain (a store's block after its
  // parent). Only a hint: a walk checks it against the key it looks for (ChainResolver).
  // Ids that are not nodes are ignored (a walk reads nodes_[hint]).
  void Link(uint32_t from, uint32_t to) {
    if (from < nodes_.size() && to < nodes_.size()) nodes_[from].next = to;
  }
  // Opening a file: for each (parent engine hash, node) pair, the parent's node (when known) hints
  // at the node (Link). The parents' table slots are prefetched ahead: one probe per pair, and a
  // million of them are ~10% of an open.
  void LinkParents(std::span<const std::pair<uint64_t, uint32_t>> pairs);
  // Returns false when the instance does not hold the hash there (unknown removal).
  bool Remove(uint32_t inst, uint32_t medium, uint32_t group, uint64_t engine_hash);
  // Removes every entry of the instances for which pred(inst) is true, on `medium` (or every
  // medium when medium == UINT32_MAX). Returns the number of entries removed.
  template <class Pred>
  int64_t ClearWhere(Pred pred, uint32_t medium);
  // Incremental clear: removes the entries of instances for which pred(inst) is true held in
  // holding-table slots [*cursor, *cursor + max_slots), advancing *cursor (wraps to 0 at the
  // end). Call under the writer lock, releasing it between calls; repeat until
  // InstanceEntries() of every cleared instance is 0 (entries moved across the cursor by other
  // writers are found by the next pass). Returns the entries removed.
  template <class Pred>
  int64_t ClearSlots(Pred pred, size_t* cursor, size_t max_slots);
  // A hidden instance is left out of Score, Holders and the per-instance counts that readers
  // see (while its entries are cleared in steps).
  void SetHidden(uint32_t inst, bool hidden) { instances_[inst].hidden = hidden; }
  bool InstanceHidden(uint32_t inst) const { return instances_[inst].hidden; }
  bool Hidden(uint32_t inst) const { return instances_[inst].hidden; }
  // Entries held by an instance (all media), kept up to date by every mutation.
  int64_t InstanceEntries(uint32_t inst) const;
  // Entries an instance holds on one medium id.
  int64_t InstanceEntriesOn(uint32_t inst, uint32_t medium) const {
    return instances_[inst].entries[medium];
  }
  void Touch(uint32_t node, uint32_t tick);
  // The LRU tick that Store gives the nodes it stores (the budget keeps recent stores).
  void set_store_tick(uint32_t tick) { store_tick_ = tick; }

  // ---- scoring ----
  // keys: engine hashes (by_engine) or content keys. filter: instance mask (W words, may be
  // shorter: missing words are 0). weights: per medium id. Returns one entry per instance in
  // the filter. *first_block_size: block size of the first query block's node (0 if none).
  std::vector<ScoreCounts> Score(BlockKeys& keys, bool by_engine,
                                 const std::vector<uint64_t>& filter,
                                 const std::vector<double>& weights, uint32_t tick,
                                 int64_t* first_block_size) const;
  // The router API's tiered walk: per instance of `filter` (hidden ones left out), out[inst] =
  // {GPU prefix, then blocks on a medium of tier <= 1, then tier <= 2} (cumulative boundaries, in
  // blocks). tier_of_medium[m]: 0 GPU, 1 CPU, 2 DISK, 3 none. Word-parallel: O(blocks x media x
  // words) plus one step per instance leaving a tier. Instances outside the filter: {0, 0, 0}.
  // TieredWalker below, fed all of `keys` (lazily hashed keys as far as the walk reads them).
  std::vector<std::array<int64_t, 3>> TieredScore(BlockKeys& keys, bool by_engine,
                                                  const std::vector<uint64_t>& filter,
                                                  const std::vector<uint8_t>& tier_of_medium) const;
  std::vector<HolderInfo> Holders(uint32_t node, bool include_hidden = false) const;
  bool InstanceHolds(uint32_t node, uint32_t inst) const;
  size_t words() const { return words_; }
  // Blocks the walks resolved through a chain hint and through the hash table, since creation
  // (added once per walk, relaxed).
  uint64_t walk_blocks_hinted() const { return walk_hinted_.load(std::memory_order_relaxed); }
  uint64_t walk_blocks_looked_up() const { return walk_looked_up_.load(std::memory_order_relaxed); }
  void CountWalk(uint64_t hinted, uint64_t looked_up) const {
    walk_hinted_.fetch_add(hinted, std::memory_order_relaxed);
    walk_looked_up_.fetch_add(looked_up, std::memory_order_relaxed);
  }

  // ---- accounting and budget ----
  size_t node_count() const { return live_nodes_; }
  size_t entry_count() const { return holdings_.size(); }
  size_t HoldingSlots() const { return holdings_.capacity(); }
  size_t AllocatedBytes() const;
  // Live-content estimate at the nominal load factor 0.5: what the budget is compared with.
  size_t BudgetBytes() const;
  // Drops least-recently-used nodes until BudgetBytes() <= target. Returns nodes dropped.
  int64_t EvictTo(size_t target_bytes);

  // Entries held per (instance, medium): O(instances x media), counts kept by every mutation.
  std::vector<std::vector<int64_t>> EntriesPerInstanceMedium() const;
  template <class F>
  void ForEachHolding(F&& f) const;  // f(node, inst, medium, group, refcount, since)

 private:
  friend class TieredWalker;
  friend class ChainResolver;
  // 32 bytes: a walk that follows `next` reads one Node per block (its keys and its hint).
  struct Node {
    uint64_t engine_hash = 0;
    uint64_t content_key = 0;
    uint32_t last_used = 0;
    uint16_t block_size = 0;
    uint8_t live = 0;
    uint8_t content_owner = 0;  // by_content_ maps content_key to this node
    // The node that followed this one in the last chain stored or walked through it (kNoNode:
    // none). Written by Store/Link under the writer lock and by walks under the reader lock
    // (relaxed atomic_ref, as last_used): a stale or torn-free hint is only a missed shortcut.
    uint32_t next = kNoNode;
  };
  static_assert(sizeof(Node) == 32);
  struct Instance {
    uint32_t source_id = 0;
    int64_t dp_rank = 0;
    std::vector<uint32_t> groups;  // group ids this instance has used
    bool hidden = false;
    std::array<int64_t, kMaxMedia> entries{};  // held entries per medium
  };

  static uint64_t HoldingKey(uint32_t node, uint32_t inst, uint32_t medium, uint32_t group) {
    return (uint64_t{node} << 32) | (uint64_t{inst & 0xFFFF} << 16) |
           (uint64_t{medium & 0xFF} << 8) | uint64_t{group & 0xFF};
  }
  static uint32_t RefOf(uint64_t v) { return static_cast<uint32_t>(v & 0xFFFF); }
  static uint64_t SinceOf(uint64_t v) { return v >> 16; }
  static uint64_t PackHolding(uint64_t since, uint32_t ref) {
    return (since << 16) | (ref > 0xFFFF ? 0xFFFF : ref);
  }

  // The instances a walk starts with: those of `filter` (missing words: none) that exist and
  // are not hidden, words_ words.
  std::vector<uint64_t> WalkStart(const std::vector<uint64_t>& filter) const;
  // Score's walk and what it adds up (per instance; per instance and medium).
  struct ScoreSums {
    std::vector<int64_t> depth, present, best;
    std::vector<uint32_t> order;  // media by weight, heaviest first (a block's best medium)
  };
  template <size_t kW>
  void ScoreWalk(BlockKeys& keys, bool by_engine, const std::vector<uint64_t>& alive, uint32_t tick,
                 int64_t* first_block_size, ScoreSums& sums) const;

  uint64_t* Row(uint32_t node, uint32_t medium) {
    return &bits_[(size_t{node} * media_slots_ + medium) * words_];
  }
  const uint64_t* Row(uint32_t node, uint32_t medium) const {
    return &bits_[(size_t{node} * media_slots_ + medium) * words_];
  }
  void Reshape(size_t words, size_t media_slots);
  uint32_t NewNode(uint64_t engine_hash);
  void FreeNode(uint32_t node);
  bool NodeEmpty(uint32_t node) const;
  // Drops holding `key` (must exist); clears the bit when no other group holds it and frees the
  // node when nothing holds it.
  void ReleaseHolding(uint32_t node, uint32_t inst, uint32_t medium, uint32_t group);

  std::vector<Instance> instances_;
  FlatTable<uint32_t> instance_by_key_;
  std::vector<std::string> media_;
  std::vector<int64_t> groups_;

  std::vector<Node> nodes_;
  std::vector<uint32_t> free_nodes_;
  size_t live_nodes_ = 0;
  FlatTable<uint32_t> by_engine_;
  FlatTable<uint32_t> by_content_;
  // Nodes whose content key another node owns in by_content_ (the same tokens under another
  // engine hash: another hash algorithm or seed). Rare; when the owner is freed one of them takes
  // the key over, so token queries still find the content.
  std::unordered_multimap<uint64_t, uint32_t> content_sharers_;
  static constexpr size_t kSharerBytes = 48;  // a node of the multimap and its bucket, about
  FlatTable<uint64_t> holdings_;
  std::vector<uint64_t> bits_;
  size_t words_ = 1;
  size_t media_slots_ = 3;
  uint32_t store_tick_ = 0;  // GPU, CPU, STORAGE; grows (x2) when other media appear
  mutable std::atomic<uint64_t> walk_hinted_{0};
  mutable std::atomic<uint64_t> walk_looked_up_{0};
};

// Resolves a query's blocks to nodes, in order (each call the block after the last). The blocks of
// a query are mostly a chain the index has seen, so before the hash table it tries the hint of the
// previous block's node (`Node::next`), checked against the key: for a chain whose nodes were
// created together that is one read of a Node streaming through memory per block instead of a
// probe that misses the cache and the TLB (the router bench's walk: ~63 -> ~30 us of memory on the
// 2-vCPU VM). A miss asks the table and leaves the hint for the next walk; while hints miss, the
// table slots of the keys kSlotAhead ahead are prefetched (a walk with no hints, e.g. after a
// restart, is the plain prefetched table walk). Same answers as table lookups alone
// (`ChainHintsNeverChangeAWalk`). The index must not change while a resolver is used.
class ChainResolver {
 public:
  static constexpr size_t kSlotAhead = 16;
  ChainResolver(const MemoryIndex& mem, bool by_engine)
      : nodes_(const_cast<MemoryIndex::Node*>(mem.nodes_.data())),
        table_(by_engine ? &mem.by_engine_ : &mem.by_content_),
        by_engine_(by_engine) {}
  // Call once per run of keys before Resolve(keys, 0 .. n - 1).
  void Start(const uint64_t* keys, size_t n) {
    if (prefetch_left_ == 0) return;
    for (size_t j = 0; j < std::min(n, kSlotAhead); ++j) table_->Prefetch(keys[j]);
  }
  // The node of keys[j] (kNoNode when the index does not hold it). REQUIRES: j < n, and keys[j]
  // follows the key of the previous call. The hint's path is inline; the table's is not (a call
  // in the walk's loop costs its registers, so only misses pay for it).
  uint32_t Resolve(const uint64_t* keys, size_t j, size_t n) {
    if (prev_ != kNoNode) {
      const uint32_t hint =
          std::atomic_ref<uint32_t>(nodes_[prev_].next).load(std::memory_order_relaxed);
      if (hint != kNoNode && Is(hint, keys[j])) {
        if (prefetch_left_ > 0) [[unlikely]] {
          PrefetchAhead(keys, j, n);
        }
        prev_ = hint;
        return hint;
      }
    }
    return FromTable(keys, j, n);
  }
  // Blocks resolved so far through the table (the others, through a hint: the caller counts
  // its calls, so the hint's path stays free of the count).
  uint64_t looked_up() const { return looked_up_; }

 private:
  // Keep prefetching until 2 * kSlotAhead blocks in a row followed their hints.
  void PrefetchAhead(const uint64_t* keys, size_t j, size_t n) {
    --prefetch_left_;
    if (j + kSlotAhead < n) table_->Prefetch(keys[j + kSlotAhead]);
  }
  [[gnu::noinline]] uint32_t FromTable(const uint64_t* keys, size_t j, size_t n) {
    ++looked_up_;
    const uint32_t* found = table_->Find(keys[j]);
    const uint32_t node = found != nullptr ? *found : kNoNode;
    if (prev_ != kNoNode && node != kNoNode) {
      std::atomic_ref<uint32_t>(nodes_[prev_].next).store(node, std::memory_order_relaxed);
    }
    if (prefetch_left_ == 0 && j + 1 < n) Start(keys + j + 1, n - j - 1);
    prefetch_left_ = 2 * kSlotAhead;
    PrefetchAhead(keys, j, n);
    prev_ = node;
    return node;
  }
  bool Is(uint32_t node, uint64_t key) const {
    const MemoryIndex::Node& n = nodes_[node];
    return n.live != 0 &&
           (by_engine_ ? n.engine_hash == key : n.content_key == key && n.content_owner != 0);
  }

  MemoryIndex::Node* nodes_;  // hints are written through it (relaxed atomics)
  const FlatTable<uint32_t>* table_;
  bool by_engine_;
  uint32_t prev_ = kNoNode;
  size_t prefetch_left_ = 2 * kSlotAhead;
  uint64_t looked_up_ = 0;
};

// TieredScore's walk fed block by block: the router API's key helper walks the keys of a /query
// while the body is still being read. The index must not change between construction and
// Finish (the caller holds the index's reader lock throughout).
class TieredWalker {
 public:
  TieredWalker(const MemoryIndex& mem, bool by_engine, const std::vector<uint64_t>& filter,
               const std::vector<uint8_t>& tier_of_medium);
  // Walks the next n blocks. False once the walk is over (no instance still walking, or a block
  // no instance holds): later keys change nothing and need not be computed.
  bool Walk(const uint64_t* keys, size_t n);
  bool done() const { return done_; }
  // The boundaries (TieredScore's answer), as far as the blocks walked.
  std::vector<std::array<int64_t, 3>> Finish();

 private:
  void Leave(size_t tier, size_t word, uint64_t bits, int64_t at);
  // Walk with the number of words fixed (1, 2: up to 128 instances, the phase masks in
  // registers) or read from words_ (0).
  template <size_t kW>
  bool WalkWords(const uint64_t* keys, size_t n);

  const MemoryIndex& mem_;
  ChainResolver resolver_;
  size_t words_;
  std::vector<std::array<int64_t, 3>> out_;
  // phase_[t * words_ + w]: instances whose walk is in tier t (0 GPU, 1 GPU|CPU, 2 any).
  std::vector<uint64_t> phase_;
  // Offsets in a node's bit row of the media of each tier (medium * words_).
  size_t tier_offset_[3][kMaxMedia] = {};
  size_t tier_count_[3] = {0, 0, 0};
  size_t walked_ = 0;    // blocks walked
  size_t resolved_ = 0;  // blocks resolved (walked, and up to kNodeAhead beyond)
  bool done_ = false;
};

template <class Pred>
int64_t MemoryIndex::ClearWhere(Pred pred, uint32_t medium) {
  struct Victim {
    uint32_t node, inst, medium, group;
  };
  std::vector<Victim> victims;
  holdings_.ForEach([&](uint64_t key, uint64_t) {
    const uint32_t inst = static_cast<uint32_t>((key >> 16) & 0xFFFF);
    const uint32_t m = static_cast<uint32_t>((key >> 8) & 0xFF);
    if ((medium == UINT32_MAX || m == medium) && pred(inst)) {
      victims.push_back(
          {static_cast<uint32_t>(key >> 32), inst, m, static_cast<uint32_t>(key & 0xFF)});
    }
  });
  for (const Victim& v : victims) ReleaseHolding(v.node, v.inst, v.medium, v.group);
  return static_cast<int64_t>(victims.size());
}

template <class Pred>
int64_t MemoryIndex::ClearSlots(Pred pred, size_t* cursor, size_t max_slots) {
  struct Victim {
    uint32_t node, inst, medium, group;
  };

  std::vector<Victim> victims;
  if (*cursor >= holdings_.capacity()) *cursor = 0;
  const size_t end = std::min(holdings_.capacity(), *cursor + max_slots);
  holdings_.ForEachInSlots(*cursor, end, [&](uint64_t key, uint64_t) {
    const uint32_t inst = static_cast<uint32_t>((key >> 16) & 0xFFFF);
    if (pred(inst)) {
      victims.push_back({static_cast<uint32_t>(key >> 32), inst,
                         static_cast<uint32_t>((key >> 8) & 0xFF),
                         static_cast<uint32_t>(key & 0xFF)});
    }
  });
  *cursor = end >= holdings_.capacity() ? 0 : end;
  for (const Victim& v : victims) ReleaseHolding(v.node, v.inst, v.medium, v.group);
  return static_cast<int64_t>(victims.size());
}

template <class F>
void MemoryIndex::ForEachHolding(F&& f) const {
  holdings_.ForEach([&](uint64_t key, uint64_t v) {
    f(static_cast<uint32_t>(key >> 32), static_cast<uint32_t>((key >> 16) & 0xFFFF),
      static_cast<uint32_t>((key >> 8) & 0xFF), static_cast<uint32_t>(key & 0xFF), RefOf(v),
      SinceOf(v));
  });
}

}  // namespace kvo::indexer_internal
