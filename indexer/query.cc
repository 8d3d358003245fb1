// Indexer, queries: Score, Tiered, Explain, Stats, Dump and LastSequence, under the shared
// state lock. See indexer/DESIGN.md.
#include "indexer/indexer.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "common/logging.h"
#include "indexer/indexer_internal.h"

namespace kvo {

using indexer_internal::DefaultWeight;
using indexer_internal::kNoNode;
using indexer_internal::MediumOfKey;
using indexer_internal::MemoryIndex;
using indexer_internal::OwnershipOfKey;
using indexer_internal::ResidencyDisplay;
using indexer_internal::Stmt;

Result<uint64_t> Indexer::LastSequence(std::string_view source, int64_t dp_rank) const {
  const Impl& d = *impl_;
  ReaderLock l(&d.state_mu);
  auto it = d.source_ids.find(source);
  if (it != d.source_ids.end()) {
    auto s = d.streams.find({it->second, dp_rank});
    if (s != d.streams.end()) return s->second.last_seq;
  }
  return Status::NotFound("no sequence applied for source '" + std::string(source) + "' rank " +
                          std::to_string(dp_rank));
}

// ---------------------------------------------------------------------------------------------
// Queries.

Result<indexer_internal::BlockKeys> Indexer::Impl::QueryKeys(const ScoreQuery& q, bool* by_engine,
                                                             int64_t* block_size) const {
  const bool has_tokens = !q.token_ids.empty();
  const bool has_hashes = !q.block_hashes.empty();
  if (has_tokens == has_hashes) {
    return Status::InvalidArgument(has_tokens
                                       ? "score query has both token_ids and block_hashes"
                                       : "score query has neither token_ids nor block_hashes");
  }
  if (q.block_size && *q.block_size <= 0) {
    return Status::InvalidArgument("score query block_size must be positive, got " +
                                   std::to_string(*q.block_size));
  }
  for (const auto& [name, w] : q.weights) {
    if (!std::isfinite(w) || w < 0) {
      return Status::InvalidArgument("score query weight of medium '" + name +
                                     "' must be a finite non-negative number");
    }
  }
  *block_size = q.block_size.value_or(has_tokens ? opt.default_block_size : 0);
  *by_engine = has_hashes;
  if (has_hashes) return indexer_internal::BlockKeys::Given(q.block_hashes);
  if (*block_size <= 0) {
    return Status::InvalidArgument("block_size must be positive, got " +
                                   std::to_string(*block_size));
  }
  if (!q.content_keys.empty()) {
    if (q.content_keys.size() != q.token_ids.size() / static_cast<size_t>(*block_size)) {
      return Status::InvalidArgument(
          "score query has " + std::to_string(q.content_keys.size()) + " content keys for " +
          std::to_string(q.token_ids.size() / static_cast<size_t>(*block_size)) + " blocks");
    }
    return indexer_internal::BlockKeys::Given(q.content_keys);
  }
  // Content keys are hashed lazily, as far as the scoring walk reads them.
  return indexer_internal::BlockKeys::FromTokens(q.token_ids, static_cast<size_t>(*block_size),
                                                 ContentKeyRoot(q.lora_name.value_or("")));
}

Result<ScoreResult> Indexer::Impl::ScoreLocked(const ScoreQuery& q, std::vector<uint64_t>* keys_out,
                                               bool* by_engine_out) const {
  bool by_engine = false;
  int64_t block_size = 0;
  KVO_ASSIGN_OR_RETURN(indexer_internal::BlockKeys keys, QueryKeys(q, &by_engine, &block_size));
  const size_t W = mem.words();
  std::vector<uint64_t> filter(W, 0);
  if (q.sources.empty()) {
    std::fill(filter.begin(), filter.end(), ~uint64_t{0});
  } else {
    for (const std::string& name : q.sources) {
      auto it = source_ids.find(name);
      if (it == source_ids.end()) {
        return Status::InvalidArgument("score query names unknown source '" + name + "'");
      }
      for (uint32_t inst = 0; inst < mem.instance_count(); ++inst) {
        if (mem.InstanceSource(inst) == it->second) filter[inst / 64] |= uint64_t{1} << (inst % 64);
      }
    }
  }
  // Streams without a sequence (cleared) and no entries are not reported.
  std::vector<double> weights(mem.medium_count());
  for (size_t m = 0; m < weights.size(); ++m) {
    const std::string& key = mem.MediumName(static_cast<uint32_t>(m));
    const std::string medium = MediumOfKey(key);
    // A weight given for "CPU/kvcr" applies to that residency; one for "CPU" to every CPU copy.
    auto it = q.weights.find(ResidencyDisplay(key));
    if (it == q.weights.end()) it = q.weights.find(medium);
    weights[m] = it != q.weights.end() ? it->second : DefaultWeight(medium);
  }
  int64_t first_bs = 0;
  std::vector<indexer_internal::ScoreCounts> counts = mem.Score(
      keys, by_engine, filter, weights, tick.fetch_add(1, std::memory_order_relaxed), &first_bs);
  scores.fetch_add(1, std::memory_order_relaxed);
  if (block_size == 0) block_size = first_bs;
  ScoreResult res;
  res.query_blocks = static_cast<int64_t>(keys.size());
  res.block_size = block_size;
  for (const auto& c : counts) {
    const uint32_t sid = mem.InstanceSource(c.instance);
    const int64_t rank = mem.InstanceRank(c.instance);
    if (c.depth == 0 && streams.find({sid, rank}) == streams.end()) continue;  // cleared stream
    InstanceScore s;
    s.source = source_names[sid - 1];
    s.dp_rank = rank;
    s.prefix_blocks = c.depth;
    s.prefix_tokens = c.depth * block_size;
    for (size_t m = 0; m < c.present.size(); ++m) {
      if (c.present[m] > 0)
        s.blocks_per_medium[ResidencyDisplay(mem.MediumName(static_cast<uint32_t>(m)))] =
            c.present[m];
      s.score += weights[m] * static_cast<double>(c.best[m]);
    }
    res.instances.push_back(std::move(s));
  }
  std::sort(res.instances.begin(), res.instances.end(),
            [](const InstanceScore& a, const InstanceScore& b) {
              if (a.score != b.score) return a.score > b.score;
              if (a.prefix_blocks != b.prefix_blocks) return a.prefix_blocks > b.prefix_blocks;
              if (a.source != b.source) return a.source < b.source;
              return a.dp_rank < b.dp_rank;
            });
  if (keys_out) *keys_out = keys.All();
  if (by_engine_out) *by_engine_out = by_engine;
  return res;
}

Result<ScoreResult> Indexer::Score(const ScoreQuery& query) const {
  ReaderLock l(&impl_->state_mu);
  return impl_->ScoreLocked(query, nullptr, nullptr);
}

void Indexer::Impl::TieredScope(const std::vector<std::string>& sources,
                                std::vector<uint64_t>* filter, std::vector<uint8_t>* tiers) const {
  filter->assign(mem.words(), 0);
  for (uint32_t inst = 0; inst < mem.instance_count(); ++inst) {
    bool wanted = sources.empty();
    for (const std::string& name : sources) {
      auto it = source_ids.find(name);
      wanted = wanted || (it != source_ids.end() && mem.InstanceSource(inst) == it->second);
    }
    if (wanted) (*filter)[inst / 64] |= uint64_t{1} << (inst % 64);
  }
  tiers->assign(mem.medium_count(), 3);
  for (size_t m = 0; m < tiers->size(); ++m) {
    const std::string name = MediumOfKey(mem.MediumName(static_cast<uint32_t>(m)));
    if (name == "GPU") {
      (*tiers)[m] = 0;
    } else if (name == "CPU") {
      (*tiers)[m] = 1;
    } else if (name == "STORAGE" || name == "DISK") {
      (*tiers)[m] = 2;
    }
  }
}

std::vector<Indexer::TieredMatch> Indexer::Impl::TieredMatches(
    const std::vector<std::array<int64_t, 3>>& bounds, const std::vector<uint64_t>& filter) const {
  scores.fetch_add(1, std::memory_order_relaxed);
  std::vector<TieredMatch> out;
  for (uint32_t inst = 0; inst < bounds.size(); ++inst) {
    if ((filter[inst / 64] >> (inst % 64) & 1) == 0 || mem.InstanceHidden(inst)) continue;
    const uint32_t sid = mem.InstanceSource(inst);
    const int64_t rank = mem.InstanceRank(inst);
    if (bounds[inst][2] == 0 && streams.find({sid, rank}) == streams.end()) continue;
    out.push_back({source_names[sid - 1], rank, bounds[inst][0], bounds[inst][1], bounds[inst][2]});
  }
  return out;
}

Result<std::vector<Indexer::TieredMatch>> Indexer::Tiered(const ScoreQuery& query) const {
  const Impl& d = *impl_;
  ReaderLock l(&d.state_mu);
  bool by_engine = false;
  int64_t block_size = 0;
  KVO_ASSIGN_OR_RETURN(indexer_internal::BlockKeys keys,
                       d.QueryKeys(query, &by_engine, &block_size));
  std::vector<uint64_t> filter;
  std::vector<uint8_t> tiers;
  d.TieredScope(query.sources, &filter, &tiers);
  return d.TieredMatches(d.mem.TieredScore(keys, by_engine, filter, tiers), filter);
}

// The reader lock is taken in StartTieredWalk and released in Finish (or the destructor), on one
// thread; the analysis cannot follow a lock held by an object, so these functions opt out.
struct Indexer::TieredWalk::State {
  const Impl* d = nullptr;
  std::vector<uint64_t> filter;
  std::optional<indexer_internal::TieredWalker> walker;
};

Indexer::TieredWalk::TieredWalk(std::unique_ptr<State> state) : state_(std::move(state)) {}

std::unique_ptr<Indexer::TieredWalk> Indexer::StartTieredWalk() const NO_THREAD_SAFETY_ANALYSIS {
  auto st = std::make_unique<TieredWalk::State>();
  st->d = impl_.get();
  impl_->state_mu.LockShared();
  std::vector<uint8_t> tiers;
  impl_->TieredScope({}, &st->filter, &tiers);
  st->walker.emplace(impl_->mem, /*by_engine=*/false, st->filter, tiers);
  return std::unique_ptr<TieredWalk>(new TieredWalk(std::move(st)));
}

bool Indexer::TieredWalk::Walk(std::span<const uint64_t> content_keys) {
  return state_->walker && state_->walker->Walk(content_keys.data(), content_keys.size());
}

std::vector<Indexer::TieredMatch> Indexer::TieredWalk::Finish() NO_THREAD_SAFETY_ANALYSIS {
  if (!state_->walker) return {};
  std::vector<TieredMatch> out = state_->d->TieredMatches(state_->walker->Finish(), state_->filter);
  state_->walker.reset();
  state_->d->state_mu.UnlockShared();
  return out;
}

Indexer::TieredWalk::~TieredWalk() NO_THREAD_SAFETY_ANALYSIS {
  if (state_->walker) {
    state_->walker.reset();
    state_->d->state_mu.UnlockShared();
  }
}

Result<ExplainResult> Indexer::Explain(const ScoreQuery& query) const {
  const Impl& d = *impl_;
  ReaderLock l(&d.state_mu);
  std::vector<uint64_t> keys;
  bool by_engine = false;
  KVO_ASSIGN_OR_RETURN(ScoreResult score, d.ScoreLocked(query, &keys, &by_engine));
  ExplainResult out;
  int64_t max_depth = 0;
  for (const auto& s : score.instances) max_depth = std::max(max_depth, s.prefix_blocks);
  const size_t shown = std::min(keys.size(), static_cast<size_t>(max_depth) + 1);
  std::vector<uint32_t> nodes(keys.size(), kNoNode);
  for (size_t i = 0; i < shown; ++i) {
    nodes[i] = by_engine ? d.mem.NodeByEngine(keys[i]) : d.mem.NodeByContent(keys[i]);
    ExplainBlock b;
    b.index = static_cast<int64_t>(i);
    b.known = nodes[i] != kNoNode;
    if (by_engine) {
      b.engine_hash = keys[i];
      b.content_key = b.known ? d.mem.NodeContentKey(nodes[i]) : 0;
    } else {
      b.content_key = keys[i];
      b.engine_hash = b.known ? d.mem.NodeEngineHash(nodes[i]) : 0;
    }
    if (b.known) {
      for (const auto& h : d.mem.Holders(nodes[i])) {
        ExplainHolder x;
        const uint32_t sid = d.mem.InstanceSource(h.instance);
        x.source = d.source_names[sid - 1];
        x.dp_rank = d.mem.InstanceRank(h.instance);
        x.medium = MediumOfKey(d.mem.MediumName(h.medium));
        x.ownership = OwnershipOfKey(d.mem.MediumName(h.medium));
        x.group = d.mem.GroupValue(h.group);
        x.refcount = h.refcount;
        x.since_seq = h.since_seq;
        b.holders.push_back(std::move(x));
      }
      std::sort(b.holders.begin(), b.holders.end(),
                [](const ExplainHolder& a, const ExplainHolder& c) {
                  return std::tie(a.source, a.dp_rank, a.medium, a.ownership, a.group) <
                         std::tie(c.source, c.dp_rank, c.medium, c.ownership, c.group);
                });
    }
    out.blocks.push_back(std::move(b));
  }
  for (const auto& s : score.instances) {
    ExplainInstance e;
    e.source = s.source;
    e.dp_rank = s.dp_rank;
    e.prefix_blocks = s.prefix_blocks;
    const size_t at = static_cast<size_t>(s.prefix_blocks);
    if (at >= keys.size()) {
      e.break_reason = "end of prompt";
    } else if (nodes[at] == kNoNode) {
      e.break_reason = "block " + std::to_string(at) +
                       " unknown to the index (never stored, removed everywhere, or dropped by "
                       "the memory budget)";
    } else {
      std::set<std::pair<std::string, int64_t>> others;
      for (const auto& h : out.blocks[at].holders) others.insert({h.source, h.dp_rank});
      e.break_reason = "block " + std::to_string(at) + " not held by this instance (held by " +
                       std::to_string(others.size()) + " other instance" +
                       (others.size() == 1 ? "" : "s") + ")";
    }
    out.instances.push_back(std::move(e));
  }
  out.score = std::move(score);
  return out;
}

IndexerStats Indexer::Stats() const {
  const Impl& d = *impl_;
  IndexerStats st;
  {
    ReaderLock l(&d.state_mu);
    const auto per = d.mem.EntriesPerInstanceMedium();
    for (uint32_t inst = 0; inst < per.size(); ++inst) {
      if (d.mem.Hidden(inst)) continue;  // being cleared
      for (uint32_t m = 0; m < per[inst].size(); ++m) {
        if (per[inst][m] == 0) continue;
        MediumStats ms;
        ms.source = d.source_names[d.mem.InstanceSource(inst) - 1];
        ms.dp_rank = d.mem.InstanceRank(inst);
        ms.medium = ResidencyDisplay(d.mem.MediumName(m));
        ms.blocks = per[inst][m];
        st.per_medium.push_back(std::move(ms));
      }
    }
    for (const auto& [key, s] : d.streams) {
      StreamStats ss;
      ss.source = d.source_names[key.first - 1];
      ss.dp_rank = key.second;
      ss.last_seq = s.last_seq;
      ss.durable_seq = s.durable_seq;
      ss.last_event_ts = s.last_ts;
      ss.has_seq = true;
      st.streams.push_back(std::move(ss));
    }
    st.counters = d.counters;
    st.counters.walk_blocks_hinted = static_cast<int64_t>(d.mem.walk_blocks_hinted());
    st.counters.walk_blocks_looked_up = static_cast<int64_t>(d.mem.walk_blocks_looked_up());
    st.blocks_in_memory = static_cast<int64_t>(d.mem.node_count());
    st.entries_in_memory = static_cast<int64_t>(d.mem.entry_count());
    st.memory_bytes = d.mem.AllocatedBytes();
    st.load_peak_bytes = d.load_peak_bytes;
  }
  st.counters.scores = d.scores.load();
  st.memory_budget_bytes = d.opt.memory_budget_bytes;
  st.sqlite_cache_bytes = d.opt.sqlite_cache_bytes;
  st.sqlite_memory_bytes = sqlite3_memory_used();
  st.log_rows_pending = d.log_rows_pending.load();
  st.schema_version = kSchemaVersion;
  std::sort(
      st.per_medium.begin(), st.per_medium.end(), [](const MediumStats& a, const MediumStats& b) {
        return std::tie(a.source, a.dp_rank, a.medium) < std::tie(b.source, b.dp_rank, b.medium);
      });
  std::sort(st.streams.begin(), st.streams.end(), [](const StreamStats& a, const StreamStats& b) {
    return std::tie(a.source, a.dp_rank) < std::tie(b.source, b.dp_rank);
  });
  st.sqlite_bytes = d.sqlite_bytes.load();
  if (d.opt.read_only) {
    // No writer here: the connection is free (used under db_mu only). A writer's Stats never
    // waits for SQLite: the size is kept after each write.
    MutexLock l(&const_cast<Impl&>(d).db_mu);
    Stmt q;
    if (q.Prepare(d.db,
                  "SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()")
            .ok() &&
        q.Step() == SQLITE_ROW) {
      st.sqlite_bytes = q.ColInt(0);
    }
  }
  return st;
}

void Indexer::Dump(const std::function<bool(const DumpEntry&)>& fn) const {
  const Impl& d = *impl_;
  ReaderLock l(&d.state_mu);
  std::vector<DumpEntry> all;
  // The callback runs under this lock; pointers keep the analysis from asking for it again.
  const MemoryIndex* mem = &d.mem;
  const std::vector<std::string>* names = &d.source_names;
  mem->ForEachHolding([&](uint32_t node, uint32_t inst, uint32_t medium, uint32_t group,
                          uint32_t ref, uint64_t since) {
    if (mem->Hidden(inst)) return;  // being cleared
    DumpEntry e;
    e.source = (*names)[mem->InstanceSource(inst) - 1];
    e.dp_rank = mem->InstanceRank(inst);
    e.medium = MediumOfKey(mem->MediumName(medium));
    e.ownership = OwnershipOfKey(mem->MediumName(medium));
    e.group = mem->GroupValue(group);
    e.engine_hash = mem->NodeEngineHash(node);
    e.content_key = mem->NodeContentKey(node);
    e.block_size = mem->NodeBlockSize(node);
    e.refcount = ref;
    e.since_seq = since;
    all.push_back(std::move(e));
  });
  std::sort(all.begin(), all.end(), [](const DumpEntry& a, const DumpEntry& b) {
    return std::tie(a.source, a.dp_rank, a.medium, a.ownership, a.group, a.engine_hash) <
           std::tie(b.source, b.dp_rank, b.medium, b.ownership, b.group, b.engine_hash);
  });
  for (const DumpEntry& e : all) {
    if (!fn(e)) break;
  }
}

const std::string& Indexer::path() const { return impl_->path; }

}  // namespace kvo
