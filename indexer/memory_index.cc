#include "indexer/internal/memory_index.h"

#include <algorithm>
#include <atomic>
#include <bit>

namespace kvo::indexer_internal {
MemoryIndex::MemoryIndex() {
  media_ = {"GPU", "CPU", "STORAGE"};
  bits_.clear();
}

uint32_t MemoryIndex::InstanceId(uint32_t source_id, int64_t dp_rank) {
  const uint64_t key = (uint64_t{source_id} << 32) ^ static_cast<uint64_t>(dp_rank);
  if (const uint32_t* id = instance_by_key_.Find(key)) return *id;
  if (instances_.size() >= kMaxInstances) return UINT32_MAX;
  const uint32_t id = static_cast<uint32_t>(instances_.size());
  instances_.emplace_back();
  instances_.back().source_id = source_id;
  instances_.back().dp_rank = dp_rank;
  instance_by_key_.Insert(key, id);
  const size_t need_words = (instances_.size() + 63) / 64;
  if (need_words > words_) Reshape(need_words, media_slots_);
  return id;
}

uint32_t MemoryIndex::FindInstance(uint32_t source_id, int64_t dp_rank) const {
  const uint64_t key = (uint64_t{source_id} << 32) ^ static_cast<uint64_t>(dp_rank);
  const uint32_t* id = instance_by_key_.Find(key);
  return id ? *id : UINT32_MAX;
}

uint32_t MemoryIndex::FindMedium(const std::string& name) const {
  for (size_t i = 0; i < media_.size(); ++i) {
    if (media_[i] == name) return static_cast<uint32_t>(i);
  }
  return UINT32_MAX;
}

uint32_t MemoryIndex::FindGroup(int64_t group) const {
  for (size_t i = 0; i < groups_.size(); ++i) {
    if (groups_[i] == group) return static_cast<uint32_t>(i);
  }
  return UINT32_MAX;
}

uint32_t MemoryIndex::MediumId(const std::string& name) {
  if (const uint32_t m = FindMedium(name); m != UINT32_MAX) return m;
  if (media_.size() >= kMaxMedia || name.size() > kMaxMediumNameBytes) return UINT32_MAX;
  media_.push_back(name);
  if (media_.size() > media_slots_) Reshape(words_, media_slots_ * 2);
  return static_cast<uint32_t>(media_.size() - 1);
}

uint32_t MemoryIndex::GroupId(int64_t group) {
  if (const uint32_t g = FindGroup(group); g != UINT32_MAX) return g;
  if (groups_.size() >= kMaxGroups) return UINT32_MAX;
  groups_.push_back(group);
  return static_cast<uint32_t>(groups_.size() - 1);
}

void MemoryIndex::Reshape(size_t words, size_t media_slots) {
  std::vector<uint64_t> next(nodes_.size() * media_slots * words, 0);
  for (size_t n = 0; n < nodes_.size(); ++n) {
    for (size_t m = 0; m < media_slots_ && m < media_slots; ++m) {
      for (size_t w = 0; w < words_ && w < words; ++w) {
        next[(n * media_slots + m) * words + w] = bits_[(n * media_slots_ + m) * words_ + w];
      }
    }
  }
  bits_.swap(next);
  words_ = words;
  media_slots_ = media_slots;
}

uint32_t MemoryIndex::NodeByEngine(uint64_t engine_hash) const {
  const uint32_t* n = by_engine_.Find(engine_hash);
  return n ? *n : kNoNode;
}

void MemoryIndex::LinkParents(std::span<const std::pair<uint64_t, uint32_t>> pairs) {
  constexpr size_t kAhead = 16;
  for (size_t i = 0; i < pairs.size(); ++i) {
    if (i + kAhead < pairs.size()) by_engine_.Prefetch(pairs[i + kAhead].first);
    const uint32_t from = NodeByEngine(pairs[i].first);
    if (from != kNoNode) Link(from, pairs[i].second);
  }
}

uint32_t MemoryIndex::NodeByContent(uint64_t content_key) const {
  if (content_key == 0) return kNoNode;
  const uint32_t* n = by_content_.Find(content_key);
  return n ? *n : kNoNode;
}

uint32_t MemoryIndex::NewNode(uint64_t engine_hash) {
  uint32_t id;
  if (!free_nodes_.empty()) {
    id = free_nodes_.back();
    free_nodes_.pop_back();
  } else {
    id = static_cast<uint32_t>(nodes_.size());
    if (nodes_.size() == nodes_.capacity()) {
      // Grow by 1.5x rather than the library's 2x: these two arrays dominate memory.
      const size_t cap = std::max<size_t>(1024, nodes_.capacity() + nodes_.capacity() / 2);
      nodes_.reserve(cap);
      bits_.reserve(cap * media_slots_ * words_);
    }
    nodes_.emplace_back();
    bits_.resize(nodes_.size() * media_slots_ * words_, 0);
  }
  nodes_[id] = Node{};
  nodes_[id].engine_hash = engine_hash;
  nodes_[id].live = 1;
  by_engine_.Insert(engine_hash, id);
  ++live_nodes_;
  return id;
}

void MemoryIndex::FreeNode(uint32_t node) {
  Node& n = nodes_[node];
  by_engine_.Erase(n.engine_hash);
  if (n.content_key != 0) {
    auto [first, last] = content_sharers_.equal_range(n.content_key);
    if (n.content_owner != 0) {
      by_content_.Erase(n.content_key);
      if (first != last) {  // a node with the same content under another hash takes it over
        const uint32_t heir = first->second;
        content_sharers_.erase(first);
        by_content_.Insert(nodes_[heir].content_key, heir);
        nodes_[heir].content_owner = 1;
      }
    } else {
      for (auto it = first; it != last; ++it) {
        if (it->second == node) {
          content_sharers_.erase(it);
          break;
        }
      }
    }
  }
  std::fill_n(Row(node, 0), media_slots_ * words_, 0);
  n = Node{};
  free_nodes_.push_back(node);
  --live_nodes_;
}

bool MemoryIndex::NodeEmpty(uint32_t node) const {
  const uint64_t* r = Row(node, 0);
  for (size_t i = 0; i < media_slots_ * words_; ++i) {
    if (r[i]) return false;
  }
  return true;
}

bool MemoryIndex::Store(uint32_t inst, uint32_t medium, uint32_t group, uint64_t engine_hash,
                        uint64_t content_key, int64_t block_size, uint64_t seq, uint32_t refcount,
                        bool* conflict, uint32_t* node_out) {
  *conflict = false;
  uint32_t node = NodeByEngine(engine_hash);
  if (node == kNoNode) node = NewNode(engine_hash);
  if (node_out != nullptr) *node_out = node;
  Node& n = nodes_[node];
  std::atomic_ref<uint32_t>(n.last_used).store(store_tick_, std::memory_order_relaxed);
  if (content_key != 0) {
    if (n.content_key == 0) {
      n.content_key = content_key;
      if (by_content_.Find(content_key) == nullptr) {
        by_content_.Insert(content_key, node);
        n.content_owner = 1;
      } else {
        content_sharers_.emplace(content_key, node);
      }
    } else if (n.content_key != content_key) {
      *conflict = true;
    }
  }
  if (n.block_size == 0 && block_size > 0) {
    n.block_size = static_cast<uint16_t>(std::min<int64_t>(block_size, 0xFFFF));
  }
  const uint64_t key = HoldingKey(node, inst, medium, group);
  Instance& in = instances_[inst];
  if (std::find(in.groups.begin(), in.groups.end(), group) == in.groups.end()) {
    in.groups.push_back(group);
  }
  if (uint64_t* h = holdings_.FindMutable(key)) {
    *h = PackHolding(SinceOf(*h), RefOf(*h) + refcount);
    return true;
  }
  holdings_.Insert(key, PackHolding(seq, refcount));
  ++in.entries[medium];
  Row(node, medium)[inst / 64] |= uint64_t{1} << (inst % 64);
  return false;
}

void MemoryIndex::ReleaseHolding(uint32_t node, uint32_t inst, uint32_t medium, uint32_t group) {
  if (holdings_.Erase(HoldingKey(node, inst, medium, group))) --instances_[inst].entries[medium];
  for (uint32_t g : instances_[inst].groups) {
    if (g != group && holdings_.Find(HoldingKey(node, inst, medium, g)) != nullptr) return;
  }
  Row(node, medium)[inst / 64] &= ~(uint64_t{1} << (inst % 64));
  if (NodeEmpty(node)) FreeNode(node);
}

bool MemoryIndex::Remove(uint32_t inst, uint32_t medium, uint32_t group, uint64_t engine_hash) {
  const uint32_t node = NodeByEngine(engine_hash);
  if (node == kNoNode) return false;
  uint64_t* h = holdings_.FindMutable(HoldingKey(node, inst, medium, group));
  if (h == nullptr) return false;
  const uint32_t ref = RefOf(*h);
  if (ref > 1) {
    *h = PackHolding(SinceOf(*h), ref - 1);
    return true;
  }
  ReleaseHolding(node, inst, medium, group);
  return true;
}

void MemoryIndex::Touch(uint32_t node, uint32_t tick) {
  std::atomic_ref<uint32_t>(nodes_[node].last_used).store(tick, std::memory_order_relaxed);
}

std::vector<uint64_t> MemoryIndex::WalkStart(const std::vector<uint64_t>& filter) const {
  const size_t n_inst = instances_.size();
  std::vector<uint64_t> mask(words_, 0);
  for (size_t w = 0; w < words_ && w < filter.size(); ++w) mask[w] = filter[w];
  for (size_t w = 0; w < words_; ++w) {
    const size_t lo = w * 64;
    if (lo >= n_inst) {
      mask[w] = 0;
    } else if (n_inst - lo < 64) {
      mask[w] &= (uint64_t{1} << (n_inst - lo)) - 1;
    }
  }
  for (uint32_t inst = 0; inst < n_inst; ++inst) {
    if (instances_[inst].hidden) mask[inst / 64] &= ~(uint64_t{1} << (inst % 64));
  }
  return mask;
}

std::vector<std::array<int64_t, 3>> MemoryIndex::TieredScore(
    BlockKeys& keys, bool by_engine, const std::vector<uint64_t>& filter,
    const std::vector<uint8_t>& tier_of_medium) const {
  TieredWalker walker(*this, by_engine, filter, tier_of_medium);
  // Lazily hashed keys in doubling steps (64, 128, ...): at most about twice the keys the walk
  // reads are hashed, as BlockKeys' own reads do.
  for (size_t done = 0, step = 64; done < keys.size() && !walker.done(); done += step, step *= 2) {
    step = std::min(step, keys.size() - done);
    walker.Walk(keys.First(done + step) + done, step);
  }
  return walker.Finish();
}

TieredWalker::TieredWalker(const MemoryIndex& mem, bool by_engine,
                           const std::vector<uint64_t>& filter,
                           const std::vector<uint8_t>& tier_of_medium)
    : mem_(mem),
      resolver_(mem, by_engine),
      words_(mem.words_),
      out_(mem.instances_.size(), {0, 0, 0}),
      phase_(3 * mem.words_, 0) {
  const size_t W = words_;
  const std::vector<uint64_t> start = mem.WalkStart(filter);
  std::copy(start.begin(), start.end(), phase_.begin());  // every walker starts in the GPU tier
  // The media of each tier, so a block's per-tier masks are plain ORs.
  for (size_t m = 0; m < mem.media_.size() && m < tier_of_medium.size(); ++m) {
    const uint8_t t = tier_of_medium[m];
    if (t <= 2) tier_offset_[t][tier_count_[t]++] = m * W;
  }
}

// Instances leaving tier t at block `at`: their boundary t (and they enter tier t + 1).
void TieredWalker::Leave(size_t tier, size_t word, uint64_t bits, int64_t at) {
  for (uint64_t b = bits; b; b &= b - 1) {
    out_[word * 64 + static_cast<size_t>(std::countr_zero(b))][tier] = at;
  }
}

bool TieredWalker::Walk(const uint64_t* keys, size_t n) {
  if (done_) return false;
  switch (words_) {
    case 1:
      return WalkWords<1>(keys, n);
    case 2:
      return WalkWords<2>(keys, n);
    default:
      return WalkWords<0>(keys, n);
  }
}

template <size_t kW>
bool TieredWalker::WalkWords(const uint64_t* keys, size_t n) {
  const size_t W = kW > 0 ? kW : words_;
  // The loop's state in locals (the phase masks too when the words are few): Leave's stores
  // into out_ could alias members, and the compiler would reload them block after block.
  std::array<uint64_t, 3 * (kW > 0 ? kW : 1)> local{};
  uint64_t* p = phase_.data();
  if constexpr (kW > 0) {
    std::copy_n(phase_.data(), 3 * kW, local.data());
    p = local.data();
  }
  const uint64_t* const bits = mem_.bits_.data();
  const size_t stride = mem_.media_slots_ * W;
  // The media of each tier as offsets in a row, and whether the layout is the usual one (one
  // medium per tier: GPU, CPU, STORAGE), which needs no loop.
  size_t off[3][kMaxMedia];
  const size_t c0 = tier_count_[0], c1 = tier_count_[1], c2 = tier_count_[2];
  std::copy_n(&tier_offset_[0][0], 3 * kMaxMedia, &off[0][0]);
  const bool one_each = c0 == 1 && c1 == 1 && c2 == 1;
  const size_t o0 = off[0][0], o1 = off[1][0], o2 = off[2][0];
  // Software pipeline: block i + kNodeAhead is resolved (the resolver prefetching table slots
  // further ahead while chain hints miss) and its row prefetched before block i is scored. Blocks
  // resolved ahead of an early exit are wasted work only; the walk and its answer are the plain
  // loop's.
  constexpr size_t kNodeAhead = 8;
  uint32_t ahead[kNodeAhead];
  auto resolve = [&](size_t j) {
    const uint32_t node = resolver_.Resolve(keys, j, n);
    if (node != kNoNode) __builtin_prefetch(bits + size_t{node} * stride);
    ahead[j % kNodeAhead] = node;
  };
  resolver_.Start(keys, n);
  for (size_t j = 0; j < std::min(n, kNodeAhead); ++j) resolve(j);
  bool walking = false;
  for (size_t w = 0; w < W; ++w) walking |= (p[w] | p[W + w] | p[2 * W + w]) != 0;
  bool more = true;
  size_t i = 0;
  for (; i < n; ++i) {
    const uint32_t node = ahead[i % kNodeAhead];
    if (!walking || node == kNoNode) {
      more = false;
      break;
    }
    if (i + kNodeAhead < n) resolve(i + kNodeAhead);
    const uint64_t* row = bits + size_t{node} * stride;
    walking = false;
#pragma GCC unroll 2
    for (size_t w = 0; w < W; ++w) {
      // Held on tier <= 0, <= 1, <= 2.
      uint64_t h0, h1, h2;
      if (one_each) {
        h0 = row[o0 + w];
        h1 = h0 | row[o1 + w];
        h2 = h1 | row[o2 + w];
      } else {
        h0 = 0;
        for (size_t k = 0; k < c0; ++k) h0 |= row[off[0][k] + w];
        h1 = h0;
        for (size_t k = 0; k < c1; ++k) h1 |= row[off[1][k] + w];
        h2 = h1;
        for (size_t k = 0; k < c2; ++k) h2 |= row[off[2][k] + w];
      }
      uint64_t& g0 = p[w];
      uint64_t& g1 = p[W + w];
      uint64_t& g2 = p[2 * W + w];
      const uint64_t out0 = g0 & ~h0;
      g0 &= h0;
      g1 |= out0;
      const uint64_t out1 = g1 & ~h1;
      g1 &= h1;
      g2 |= out1;
      const uint64_t out2 = g2 & ~h2;
      g2 &= h2;
      if ((out0 | out1 | out2) != 0) [[unlikely]] {
        const int64_t at = static_cast<int64_t>(walked_ + i);
        Leave(0, w, out0, at);
        Leave(1, w, out1, at);
        Leave(2, w, out2, at);
      }
      walking |= (g0 | g1 | g2) != 0;
    }
  }
  // Resolved: the first min(n, kNodeAhead), then block i + kNodeAhead at each block i scored.
  resolved_ += std::min(n, kNodeAhead) + (n > kNodeAhead ? std::min(i, n - kNodeAhead) : 0);
  walked_ += i;
  if constexpr (kW > 0) std::copy_n(local.data(), 3 * kW, phase_.data());
  if (!more) done_ = true;
  return more;
}

std::vector<std::array<int64_t, 3>> TieredWalker::Finish() {
  // Still walking at the end (of the query or of known blocks): every later boundary is here.
  const int64_t end = static_cast<int64_t>(walked_);
  const size_t W = words_;
  for (size_t w = 0; w < W; ++w) {
    const uint64_t g0 = phase_[w], g1 = phase_[W + w], g2 = phase_[2 * W + w];
    Leave(0, w, g0, end);
    Leave(1, w, g0 | g1, end);
    Leave(2, w, g0 | g1 | g2, end);
  }
  std::fill(phase_.begin(), phase_.end(), 0);
  done_ = true;
  mem_.CountWalk(resolved_ - resolver_.looked_up(), resolver_.looked_up());
  return std::move(out_);
}

// Score's walk. pres[m*W+w]: alive instances holding the current block on medium m; top[m*W+w]:
// those of them whose best medium (by weight) m is. The sums change only where those masks change
// from one block to the next, and by the bits that changed alone: a bit that turns on at block i
// subtracts i from its sum, one that turns off adds i (so a sum is the length of its runs), and an
// instance that leaves `alive` at block i has held i blocks. Real prefixes change tier a few times
// per instance, so a block costs a few word operations whatever the number of instances, and a
// change costs its changed bits (it used to cost every instance still walking). With kW words
// fixed (1, 2: up to 128 instances) the masks are fixed-size locals, out of the way of the sums'
// stores (as TieredWalker::WalkWords); 0: words_ of them.
template <size_t kW>
void MemoryIndex::ScoreWalk(BlockKeys& keys, bool by_engine, const std::vector<uint64_t>& alive0,
                            uint32_t tick, int64_t* first_block_size, ScoreSums& sums) const {
  const size_t W = kW > 0 ? kW : words_;
  const size_t M = media_.size();
  const size_t N = keys.size();
  using Words = std::conditional_t<(kW > 0), std::array<uint64_t, kW>, std::vector<uint64_t>>;
  using Rows =
      std::conditional_t<(kW > 0), std::array<uint64_t, kMaxMedia * kW>, std::vector<uint64_t>>;
  Words alive{}, was_alive{}, covered{};
  Rows pres{}, prev{}, top{}, prev_top{};
  if constexpr (kW == 0) {
    alive.assign(W, 0);
    covered.assign(W, 0);
    pres.assign(M * W, 0);
    prev.assign(M * W, 0);
    top.assign(M * W, 0);
    prev_top.assign(M * W, 0);
  }
  std::copy_n(alive0.begin(), W, alive.begin());
  was_alive = alive;
  int64_t* const depth = sums.depth.data();
  int64_t* const present = sums.present.data();
  int64_t* const best = sums.best.data();
  // Adds `delta` to sum[inst * M + m] for every instance in `bits` (word w).
  auto add = [M](int64_t* sum, size_t m, size_t w, uint64_t bits, int64_t delta) {
    for (uint64_t b = bits; b; b &= b - 1) {
      sum[(w * 64 + static_cast<size_t>(std::countr_zero(b))) * M + m] += delta;
    }
  };
  // The masks change at block `at` from prev/prev_top to pres (top computed here); pres all zero
  // (`ended`) closes every run.
  auto change = [&](int64_t at, bool ended) {
    for (size_t w = 0; w < W; ++w) covered[w] = 0;
    for (uint32_t m : sums.order) {
      for (size_t w = 0; w < W; ++w) {
        const uint64_t now = ended ? 0 : pres[m * W + w];
        top[m * W + w] = now & ~covered[w];
        covered[w] |= now;
      }
    }
    for (size_t m = 0; m < M; ++m) {
      for (size_t w = 0; w < W; ++w) {
        const size_t i = m * W + w;
        const uint64_t now = ended ? 0 : pres[i];
        add(present, m, w, now & ~prev[i], -at);
        add(present, m, w, prev[i] & ~now, at);
        add(best, m, w, top[i] & ~prev_top[i], -at);
        add(best, m, w, prev_top[i] & ~top[i], at);
        prev[i] = now;
        prev_top[i] = top[i];
      }
    }
    for (size_t w = 0; w < W; ++w) {
      const uint64_t now = ended ? 0 : alive[w];
      for (uint64_t b = was_alive[w] & ~now; b; b &= b - 1) {
        depth[w * 64 + static_cast<size_t>(std::countr_zero(b))] = at;
      }
      was_alive[w] = now;
    }
  };

  const uint64_t* const bits = bits_.data();
  const size_t stride = media_slots_ * W;
  // Blocks resolved kNodeAhead ahead of use, their rows prefetched (as TieredWalker).
  ChainResolver resolver(*this, by_engine);
  constexpr size_t kNodeAhead = 8;
  uint32_t ahead[kNodeAhead];
  // The keys as far as the resolver reads ahead (lazily hashed keys grow in doubling steps).
  const uint64_t* k = nullptr;
  size_t avail = 0;
  uint64_t resolved = 0;
  auto resolve = [&](size_t i) {
    ++resolved;
    if (i + ChainResolver::kSlotAhead >= avail && avail < N) {
      avail = std::min(N, std::max(i + ChainResolver::kSlotAhead + 1, 2 * avail + 64));
      (void)keys[avail - 1];
      k = keys.First(avail);
    }
    const uint32_t node = resolver.Resolve(k, i, avail);
    if (node != kNoNode) __builtin_prefetch(bits + size_t{node} * stride);
    ahead[i % kNodeAhead] = node;
  };
  if (N > 0) {
    resolve(0);
    resolver.Start(k + 1, avail - 1);
  }
  for (size_t i = 1; i < std::min(N, kNodeAhead); ++i) resolve(i);

  bool any_alive = false;
  for (size_t w = 0; w < W; ++w) any_alive |= alive[w] != 0;
  size_t i = 0;
  for (; i < N && any_alive; ++i) {
    const uint32_t node = ahead[i % kNodeAhead];
    if (node == kNoNode) break;
    if (i + kNodeAhead < N) resolve(i + kNodeAhead);
    if (i == 0) *first_block_size = nodes_[node].block_size;
    const uint64_t* row = bits + size_t{node} * stride;
    any_alive = false;
    bool same = true;
    for (size_t w = 0; w < W; ++w) {
      uint64_t held = 0;
      for (size_t m = 0; m < M; ++m) held |= row[m * W + w];
      alive[w] &= held;
      any_alive |= alive[w] != 0;
    }
    if (!any_alive) break;
    for (size_t m = 0; m < M; ++m) {
      for (size_t w = 0; w < W; ++w) {
        const uint64_t p = row[m * W + w] & alive[w];
        same &= p == prev[m * W + w];
        pres[m * W + w] = p;
      }
    }
    // An instance that left `alive` held the block before on some medium, so its pres bits
    // changed too: `same` covers the alive masks.
    if (!same) change(static_cast<int64_t>(i), false);
    std::atomic_ref<uint32_t>(const_cast<uint32_t&>(nodes_[node].last_used))
        .store(tick, std::memory_order_relaxed);
  }
  change(static_cast<int64_t>(i), true);
  CountWalk(resolved - resolver.looked_up(), resolver.looked_up());
}

std::vector<ScoreCounts> MemoryIndex::Score(BlockKeys& keys, bool by_engine,
                                            const std::vector<uint64_t>& filter,
                                            const std::vector<double>& weights, uint32_t tick,
                                            int64_t* first_block_size) const {
  const size_t W = words_;
  const size_t M = media_.size();
  const size_t n_inst = instances_.size();

  // alive: instances still holding every block so far.
  const std::vector<uint64_t> alive = WalkStart(filter);
  ScoreSums sums;
  sums.depth.assign(n_inst, 0);
  sums.present.assign(n_inst * M, 0);
  sums.best.assign(n_inst * M, 0);
  sums.order.resize(M);
  for (uint32_t m = 0; m < M; ++m) sums.order[m] = m;
  std::stable_sort(sums.order.begin(), sums.order.end(),
                   [&](uint32_t a, uint32_t b) { return weights[a] > weights[b]; });
  *first_block_size = 0;
  switch (W) {
    case 1:
      ScoreWalk<1>(keys, by_engine, alive, tick, first_block_size, sums);
      break;
    case 2:
      ScoreWalk<2>(keys, by_engine, alive, tick, first_block_size, sums);
      break;
    default:
      ScoreWalk<0>(keys, by_engine, alive, tick, first_block_size, sums);
      break;
  }
  const std::vector<int64_t>& depth = sums.depth;
  const std::vector<int64_t>& present = sums.present;
  const std::vector<int64_t>& best = sums.best;

  std::vector<ScoreCounts> out;
  for (uint32_t inst = 0; inst < n_inst; ++inst) {
    const size_t w = inst / 64;
    if (w >= filter.size() || !(filter[w] & (uint64_t{1} << (inst % 64)))) continue;
    if (instances_[inst].hidden) continue;
    ScoreCounts c;
    c.instance = inst;
    c.depth = depth[inst];
    c.present.assign(present.begin() + inst * M, present.begin() + (inst + 1) * M);
    c.best.assign(best.begin() + inst * M, best.begin() + (inst + 1) * M);
    out.push_back(std::move(c));
  }
  return out;
}

std::vector<HolderInfo> MemoryIndex::Holders(uint32_t node, bool include_hidden) const {
  std::vector<HolderInfo> out;
  for (uint32_t m = 0; m < media_.size(); ++m) {
    const uint64_t* r = Row(node, m);
    for (size_t w = 0; w < words_; ++w) {
      for (uint64_t b = r[w]; b; b &= b - 1) {
        const uint32_t inst = static_cast<uint32_t>(w * 64 + std::countr_zero(b));
        if (!include_hidden && instances_[inst].hidden) continue;
        for (uint32_t g : instances_[inst].groups) {
          if (const uint64_t* h = holdings_.Find(HoldingKey(node, inst, m, g))) {
            out.push_back({inst, m, g, RefOf(*h), SinceOf(*h)});
          }
        }
      }
    }
  }
  return out;
}

bool MemoryIndex::InstanceHolds(uint32_t node, uint32_t inst) const {
  for (uint32_t m = 0; m < media_.size(); ++m) {
    if (Row(node, m)[inst / 64] & (uint64_t{1} << (inst % 64))) return true;
  }
  return false;
}

size_t MemoryIndex::AllocatedBytes() const {
  return nodes_.capacity() * sizeof(Node) + bits_.capacity() * sizeof(uint64_t) +
         free_nodes_.capacity() * sizeof(uint32_t) + by_engine_.bytes() + by_content_.bytes() +
         holdings_.bytes() + instance_by_key_.bytes() + content_sharers_.size() * kSharerBytes;
}

size_t MemoryIndex::BudgetBytes() const {
  const size_t per_node = sizeof(Node) + media_slots_ * words_ * sizeof(uint64_t) +
                          2 * FlatTable<uint32_t>::kSlotBytes * 2;
  return live_nodes_ * per_node + holdings_.size() * FlatTable<uint64_t>::kSlotBytes * 2 +
         content_sharers_.size() * kSharerBytes;
}

int64_t MemoryIndex::EvictTo(size_t target_bytes) {
  if (BudgetBytes() <= target_bytes || live_nodes_ == 0) return 0;
  std::vector<std::pair<uint32_t, uint32_t>> by_age;  // (last_used, node)
  by_age.reserve(live_nodes_);
  for (uint32_t n = 0; n < nodes_.size(); ++n) {
    if (nodes_[n].live) by_age.emplace_back(nodes_[n].last_used, n);
  }
  std::sort(by_age.begin(), by_age.end());
  int64_t dropped = 0;
  for (const auto& [age, node] : by_age) {
    if (BudgetBytes() <= target_bytes) break;
    for (const HolderInfo& h : Holders(node, /*include_hidden=*/true)) {
      if (holdings_.Erase(HoldingKey(node, h.instance, h.medium, h.group))) {
        --instances_[h.instance].entries[h.medium];
      }
    }
    FreeNode(node);
    ++dropped;
  }
  return dropped;
}

std::vector<std::vector<int64_t>> MemoryIndex::EntriesPerInstanceMedium() const {
  std::vector<std::vector<int64_t>> out(instances_.size(), std::vector<int64_t>(media_.size(), 0));
  for (size_t i = 0; i < instances_.size(); ++i) {
    for (size_t m = 0; m < media_.size(); ++m) out[i][m] = instances_[i].entries[m];
  }
  return out;
}

int64_t MemoryIndex::InstanceEntries(uint32_t inst) const {
  int64_t n = 0;
  for (int64_t e : instances_[inst].entries) n += e;
  return n;
}

}  // namespace kvo::indexer_internal
