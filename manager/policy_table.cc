#include "manager/policy_table.h"

#include <sys/mman.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <string>

#include "common/check.h"

namespace kvo::policy_internal {

namespace {

// Slots for `keys` keys at load <= 0.75 (at least 8).
uint32_t SlotsFor(size_t keys) {
  size_t n = keys + keys / 3 + 8;
  KVO_CHECK(n < (size_t{1} << 31));
  return static_cast<uint32_t>(n);
}

// Large arrays ask for transparent huge pages: a lookup touches two random places (slot, node), and
// on 4 KiB pages each is also a TLB miss. glibc maps such arrays page aligned; the 2 MiB-aligned
// interior is advised (no over-allocation for alignment: that slack was ~10 bytes per block).
constexpr size_t kHugePage = size_t{2} << 20;

void* AllocateArray(size_t bytes) {
  void* p = std::malloc(bytes);
  KVO_CHECK(p != nullptr);
  if (bytes >= 2 * kHugePage) {
    const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + kHugePage - 1) & ~(kHugePage - 1);
    const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(kHugePage - 1);
    if (end > begin) (void)madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
  }
  return p;
}

Node* AllocateNodes(size_t n) { return static_cast<Node*>(AllocateArray(n * sizeof(Node))); }

void FreeNodes(Node* p) { std::free(p); }

}  // namespace

NodeTable::NodeTable(uint32_t num_lists, size_t expected_keys) : num_lists_(num_lists) {
  std::fill(std::begin(recent_), std::end(recent_), kNil);
  KVO_CHECK(num_lists >= 1 && num_lists <= 4);
  KVO_CHECK(expected_keys < kNil - 8);
  seg0_size_ = static_cast<uint32_t>(expected_keys) + num_lists;
  seg0_ = AllocateNodes(seg0_size_);
  high_water_ = 0;
  InitSentinels();
  Rehash(SlotsFor(expected_keys));
}

NodeTable::~NodeTable() {
  FreeNodes(seg0_);
  for (Node* c : chunks_) FreeNodes(c);
}

void NodeTable::InitSentinels() {
  for (uint32_t l = 0; l < num_lists_; ++l) {
    Node* n = (l < high_water_) ? &at(l) : new (&at(l)) Node();
    n->w0 = 0;
    n->w1 = 0;
    n->set_prev(l);
    n->set_next(l);
    n->set_list(l);
    list_size_[l] = 0;
  }
  high_water_ = std::max(high_water_, num_lists_);
}

Node& NodeTable::OverflowAt(uint32_t i) {
  const uint32_t j = i - seg0_size_;
  return chunks_[j >> kChunkShift][j & (kChunkSize - 1)];
}

uint32_t NodeTable::AllocNode() {
  if (free_head_ != kNil) {
    const uint32_t i = free_head_;
    free_head_ = static_cast<uint32_t>(at(i).status.slot);
    --num_free_;
    return i;
  }
  const uint32_t i = high_water_;
  KVO_CHECK(i < kNil);
  if (i >= seg0_size_ + chunks_.size() * kChunkSize) chunks_.push_back(AllocateNodes(kChunkSize));
  new (&at(i)) Node();
  ++high_water_;
  return i;
}

uint32_t NodeTable::Add(const OffloadKey& key, uint64_t hash) {
  if (count_ + 1 > grow_at_) Rehash(num_slots_ * 2);
  const uint32_t i = AllocNode();
  Node& n = at(i);
  const std::string_view d = key.digest();
  std::memcpy(n.digest, key.padded_bytes(), sizeof(n.digest));  // zero padded
  n.group = key.group();
  n.status = BlockStatus{};
  n.w0 = 0;
  n.w1 = 0;
  n.set_len(d.size());
  n.set_prev(kNil);
  n.set_next(kNil);
  n.set_list(kNoList);
  KVO_DCHECK(n.Hash() == hash);
  Place(i, hash);
  ++count_;
  memo_ = i;
  recent_[RecentSlot(hash)] = i;
  return i;
}

void NodeTable::Place(uint32_t i, uint64_t h) {
  uint32_t cur = i | (static_cast<uint32_t>(h) & tag_mask_);  // distance bits are filled in
  uint32_t d = 0;
  uint32_t pos = Home(h);
  for (;;) {
    const uint32_t s = slots_[pos];
    if ((s & idx_mask_) == 0) {
      slots_[pos] = WithDist(cur, d);
      return;
    }
    const uint32_t sd = TrueDist(s, pos);
    if (sd < d) {  // Robin Hood: the entry nearer its home moves on
      slots_[pos] = WithDist(cur, d);
      cur = s;
      d = sd;
    }
    if (++pos == num_slots_) pos = 0;
    ++d;
  }
}

void NodeTable::Erase(uint32_t i, uint64_t hash) {
  Node& n = at(i);
  KVO_DCHECK(n.Hash() == hash);
  uint32_t pos = Home(hash);
  while ((slots_[pos] & idx_mask_) != i) {
    if (++pos == num_slots_) pos = 0;
  }
  // Backward shift: pull the rest of the cluster one slot nearer home until an empty slot or an
  // entry already at home.
  for (;;) {
    uint32_t next = pos + 1;
    if (next == num_slots_) next = 0;
    const uint32_t s = slots_[next];
    if ((s & idx_mask_) == 0 || Dist(s) == 0) break;
    slots_[pos] = WithDist(s, TrueDist(s, next) - 1);
    pos = next;
  }
  slots_[pos] = 0;
  --count_;
  if (memo_ == i) memo_ = kNil;
  if (recent_[RecentSlot(hash)] == i) recent_[RecentSlot(hash)] = kNil;
  n.set_list(kNoList);
  n.status.slot = static_cast<int32_t>(free_head_);
  free_head_ = i;
  ++num_free_;
}

void NodeTable::Clear() {
  std::fill_n(slots_.get(), num_slots_, 0u);
  count_ = 0;
  memo_ = kNil;
  std::fill(std::begin(recent_), std::end(recent_), kNil);
  free_head_ = kNil;
  num_free_ = 0;
  high_water_ = num_lists_;
  InitSentinels();
}

void NodeTable::PushBack(uint32_t list, uint32_t i) {
  Node& s = at(list);
  const uint32_t tail = s.prev();
  Node& n = at(i);
  n.set_prev(tail);
  n.set_next(list);
  n.set_list(list);
  at(tail).set_next(i);
  s.set_prev(i);
  ++list_size_[list];
}

void NodeTable::Unlink(uint32_t i) {
  Node& n = at(i);
  const uint32_t p = n.prev();
  const uint32_t x = n.next();
  at(p).set_next(x);
  at(x).set_prev(p);
  --list_size_[n.list()];
  n.set_prev(kNil);
  n.set_next(kNil);
  n.set_list(kNoList);
}

void NodeTable::Rehash(uint32_t num_slots) {
  SlotArray old = std::move(slots_);
  const uint32_t old_n = num_slots_;
  const uint32_t old_mask = idx_mask_;
  KVO_CHECK(num_slots < (1u << 31));
  num_slots_ = num_slots;
  grow_at_ = size_t{num_slots} * 7 / 8;
  const int bits = std::bit_width(num_lists_ + grow_at_);
  KVO_CHECK(bits <= static_cast<int>(kIndexBits) && bits + kDistBits <= 32);
  idx_mask_ = (1u << bits) - 1;
  dist_shift_ = static_cast<uint32_t>(bits);
  tag_mask_ = bits + kDistBits == 32 ? 0u : ~((1u << (bits + kDistBits)) - 1);
  slots_.reset(static_cast<uint32_t*>(AllocateArray(size_t{num_slots} * sizeof(uint32_t))));
  std::fill_n(slots_.get(), num_slots, 0u);
  for (uint32_t s = 0; s < old_n; ++s) {
    const uint32_t i = old[s] & old_mask;
    if (i != 0) Place(i, at(i).Hash());
  }
}

Status NodeTable::CheckStructure() const {
  auto fail = [](const std::string& what) { return Status::Internal("node table: " + what); };
  // 0 free, 1 indexed, 2 indexed and listed
  std::vector<uint8_t> state(high_water_, 0);
  size_t indexed = 0;
  for (uint32_t s = 0; s < num_slots_; ++s) {
    const uint32_t i = slots_[s] & idx_mask_;
    if (i == 0) continue;
    if (i < num_lists_ || i >= high_water_) return fail("slot holds a bad node index");
    if (state[i] != 0) return fail("node indexed twice");
    const Node& n = at(i);
    const uint64_t h = n.Hash();
    if ((slots_[s] & tag_mask_) != (static_cast<uint32_t>(h) & tag_mask_))
      return fail("slot tag does not match the node's hash");
    const uint32_t home = Home(h);
    if (Dist(slots_[s]) != std::min(s >= home ? s - home : s + num_slots_ - home, kMaxDist))
      return fail("slot distance does not match the node's home");
    if (n.len() > OffloadKey::kMaxHashBytes) return fail("bad digest length");
    if (FindHashed(n.Key(), h) != i) return fail("key not found from its home slot");
    state[i] = 1;
    ++indexed;
  }
  if (indexed != count_) return fail("count does not match the index");
  if (count_ >= num_slots_) return fail("index has no empty slot");
  if (memo_ != kNil && (memo_ >= high_water_ || state[memo_] == 0)) return fail("stale memo");
  for (uint32_t r : recent_) {
    if (r != kNil && (r >= high_water_ || state[r] == 0)) return fail("stale recent node");
  }
  size_t free_count = 0;
  for (uint32_t f = free_head_; f != kNil; f = static_cast<uint32_t>(at(f).status.slot)) {
    if (f < num_lists_ || f >= high_water_ || state[f] != 0) return fail("bad free list");
    if (++free_count > num_free_) return fail("free list longer than counted");
  }
  if (free_count != num_free_) return fail("free list shorter than counted");
  if (count_ + num_free_ + num_lists_ != high_water_) return fail("nodes leaked");
  for (uint32_t l = 0; l < num_lists_; ++l) {
    uint32_t prev = l;
    size_t len = 0;
    for (uint32_t i = Front(l); i != l; i = Next(i)) {
      if (i < num_lists_ || i >= high_water_ || state[i] != 1)
        return fail("list " + std::to_string(l) + " holds a free, sentinel or repeated node");
      state[i] = 2;
      const Node& n = at(i);
      if (n.prev() != prev) return fail("list " + std::to_string(l) + ": broken prev link");
      if (n.list() != l) return fail("list " + std::to_string(l) + ": node has another list id");
      prev = i;
      ++len;
    }
    if (at(l).prev() != prev) return fail("list " + std::to_string(l) + ": bad tail");
    if (len != list_size_[l]) return fail("list " + std::to_string(l) + ": size mismatch");
  }
  if (num_lists_ < 4) {
    for (uint32_t i = num_lists_; i < high_water_; ++i)
      if (state[i] == 1 && at(i).list() != kNoList) return fail("unlisted node has a list id");
  }
  return Status::Ok();
}

void ProtectedSet::Reset(const NodeTable& table, std::span<const OffloadKey> keys) {
  ids_.clear();
  for (const OffloadKey& key : keys) {
    const uint32_t i = table.FindConst(key);
    if (i != kNil) ids_.push_back(i);
  }
  if (ids_.size() > kLinearMax) std::sort(ids_.begin(), ids_.end());
}

}  // namespace kvo::policy_internal
