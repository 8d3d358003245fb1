// Indexer, ingest: ApplyBatch (validate, convert to log rows, key by content, apply, queue for
// the store) and the clears of a source or a stream. See indexer/DESIGN.md.
#include "indexer/indexer.h"

#include <sqlite3.h>

#include <algorithm>
#include <cstdio>
#include <set>
#include <span>

#include "common/logging.h"
#include "indexer/indexer_internal.h"

namespace kvo {

using indexer_internal::Admission;
using indexer_internal::Exec;
using indexer_internal::kClearAll;
using indexer_internal::kNoNode;
using indexer_internal::kOwnerSep;
using indexer_internal::kRemove;
using indexer_internal::kStore;
using indexer_internal::LogRow;
using indexer_internal::MemoryIndex;
using indexer_internal::ResidencyKey;
using indexer_internal::StepDone;
using indexer_internal::Stmt;
using indexer_internal::StreamState;

// ---------------------------------------------------------------------------------------------
// Applying events to memory.

void Indexer::Impl::ApplyRow(const LogRow& row, ApplyOutcome* out) {
  const uint32_t inst = mem.InstanceId(row.source_id, row.dp_rank);
  const uint32_t medium = mem.MediumId(ResidencyKey(row.medium, row.ownership));
  const uint32_t group = mem.GroupId(row.group);
  if (inst == UINT32_MAX || medium == UINT32_MAX || group == UINT32_MAX) return;  // checked before
  ++counters.events;
  mem.set_store_tick(tick.load(std::memory_order_relaxed));
  switch (row.kind) {
    case kStore: {
      // A store's blocks are a chain from its parent: each node's walk hint names the next.
      uint32_t prev = row.parent ? mem.NodeByEngine(*row.parent) : kNoNode;
      for (size_t i = 0; i < row.hashes.size(); ++i) {
        bool conflict = false;
        uint32_t node = kNoNode;
        const bool dup = mem.Store(inst, medium, group, row.hashes[i], row.content_keys[i],
                                   row.block_size, row.seq, 1, &conflict, &node);
        if (prev != kNoNode) mem.Link(prev, node);
        prev = node;
        ++counters.stores;
        counters.duplicate_stores += dup ? 1 : 0;
        counters.content_mismatches += conflict ? 1 : 0;
      }
      counters.block_events += static_cast<int64_t>(row.hashes.size());
      out->block_events += static_cast<int64_t>(row.hashes.size());
      break;
    }
    case kRemove:
      for (uint64_t h : row.hashes) {
        if (mem.Remove(inst, medium, group, h)) {
          ++counters.removals;
        } else {
          ++counters.unknown_removals;
          ++out->unknown_removals;
        }
      }
      counters.block_events += static_cast<int64_t>(row.hashes.size());
      out->block_events += static_cast<int64_t>(row.hashes.size());
      break;
    case kClearAll:
      // A clear scans every holding in the index (there is no per-instance list), so one that
      // finds nothing to clear is skipped: a batch of N clears used to hold the writer lock for
      // N full scans (5,000 clears over 200k entries: 1 s of blocked queries).
      if (mem.InstanceEntriesOn(inst, medium) > 0) {
        mem.ClearWhere([inst](uint32_t i) { return i == inst; }, medium);
      }
      ++counters.clears;
      break;
    default:
      break;
  }
}

void Indexer::Impl::EvictIfNeeded() {
  // The structure gets what the SQLite page cache leaves of the budget.
  const size_t budget = opt.memory_budget_bytes - opt.sqlite_cache_bytes;
  if (mem.BudgetBytes() <= budget) return;
  counters.dropped_by_budget += mem.EvictTo(budget / 10 * 9);
}

// ---------------------------------------------------------------------------------------------
// ApplyBatch, step by step. Which lock each step holds is stated once, in indexer/DESIGN.md
// ("ApplyBatch, step by step"); the annotations in indexer_internal.h repeat it for the compiler.
//   1. CheckBatchArgs        the arguments (read-only index, source, rank, sequence)
//   2. AdmitBatch            a stream being cleared waits, a replayed sequence is skipped, the
//                            stream capacity is checked
//   3. ConvertBatch          events -> log rows, each checked against the index's limits;
//                            nothing is registered yet, so a refused batch changes nothing
//   4. RegisterBatch         the source, stream, media and groups the batch names
//   5. KeyByContent+ApplyRow per row in order: its content keys, then memory
//   6. AdvanceStream         the stream's in-memory checkpoint, then the byte budget
//   7. QueueRows             the rows join `pending`; the flush decision
//   8. FlushLocked           only when QueueRows says the caller commits (back-pressure)

Result<ApplyOutcome> Indexer::ApplyBatch(std::string_view source, int64_t dp_rank, uint64_t seq,
                                         const EventBatch& batch) {
  Impl& d = *impl_;
  KVO_RETURN_IF_ERROR(d.CheckBatchArgs(source, dp_rank, seq));
  ApplyOutcome out;
  bool must_flush = false;
  for (;;) {
    KVO_ASSIGN_OR_RETURN(const Admission admission,
                         d.RunIngestSteps(source, dp_rank, seq, batch, &out, &must_flush));
    if (admission != Admission::kClearing) break;
    d.WaitUntilNotClearing(source, dp_rank);  // then try again: the batch follows the clear
  }
  if (must_flush) {
    MutexLock db(&d.db_mu);
    KVO_RETURN_IF_ERROR(d.FlushLocked());
  }
  return out;
}

Result<Admission> Indexer::Impl::RunIngestSteps(std::string_view source, int64_t dp_rank,
                                                uint64_t seq, const EventBatch& batch,
                                                ApplyOutcome* out, bool* must_flush) {
  MutexLock ingest(&ingest_mu);
  const double now = clock->NowSeconds();
  std::vector<LogRow> rows;
  {
    WriterLock l(&state_mu);
    std::optional<uint32_t> known_sid;
    KVO_ASSIGN_OR_RETURN(const Admission admission, AdmitBatch(source, dp_rank, seq, &known_sid));
    if (admission != Admission::kApply) return admission;
    rows = ConvertBatch(source, dp_rank, seq, batch, now, out);
    KVO_ASSIGN_OR_RETURN(const uint32_t sid, RegisterBatch(source, known_sid, dp_rank, &rows));
    for (LogRow& r : rows) {
      KeyByContent(&r);  // reads the nodes the rows before it stored
      ApplyRow(r, out);
    }
    AdvanceStream(sid, dp_rank, seq, batch.ts, out);
  }
  *must_flush = QueueRows(&rows);
  return Admission::kApply;
}

Status Indexer::Impl::CheckBatchArgs(std::string_view source, int64_t dp_rank, uint64_t seq) const {
  if (opt.read_only) return Status::FailedPrecondition("index '" + path + "' is read-only");
  if (source.empty()) return Status::InvalidArgument("ApplyBatch: source name is empty");
  if (dp_rank < 0) {
    return Status::InvalidArgument("ApplyBatch: dp_rank " + std::to_string(dp_rank) +
                                   " of source '" + std::string(source) + "' is negative");
  }
  if (seq > (uint64_t{1} << 62)) {
    return Status::InvalidArgument("ApplyBatch: sequence " + std::to_string(seq) + " of source '" +
                                   std::string(source) + "' is out of range");
  }
  return Status::Ok();
}

Result<Admission> Indexer::Impl::AdmitBatch(std::string_view source, int64_t dp_rank, uint64_t seq,
                                            std::optional<uint32_t>* known_sid) {
  const auto src_it = source_ids.find(source);
  if (src_it != source_ids.end()) {
    const uint32_t sid = src_it->second;
    *known_sid = sid;
    if (ClearingCovers(sid, dp_rank)) return Admission::kClearing;
    const auto sit = streams.find({sid, dp_rank});
    if (sit != streams.end() && seq <= sit->second.last_seq) {
      ++counters.batches_duplicate;
      return Admission::kReplayed;
    }
  }
  if ((!*known_sid || mem.FindInstance(**known_sid, dp_rank) == UINT32_MAX) &&
      mem.instance_count() >= indexer_internal::kMaxInstances) {
    return Status::OutOfRange("too many (source, dp_rank) streams in index '" + path + "'");
  }
  return Admission::kApply;
}

namespace {

// One event as its log row; the source id is set when the batch is registered.
LogRow ToLogRow(const KvEvent& ev, int64_t dp_rank, uint64_t seq, double ts, double now) {
  LogRow r;
  r.dp_rank = dp_rank;
  r.seq = seq;
  r.ts = ts;
  r.seen_at = now;
  if (const auto* st = std::get_if<BlockStored>(&ev)) {
    r.kind = kStore;
    r.medium = st->medium.value_or(kMediumGpu);
    r.ownership = st->ownership.value_or("");
    r.group = st->group_idx.value_or(0);
    r.block_size = st->block_size;
    r.lora_name = st->lora_name;
    if (st->parent_block_hash) r.parent = st->parent_block_hash->Low64();
    r.hashes.reserve(st->block_hashes.size());
    for (const BlockHash& h : st->block_hashes) r.hashes.push_back(h.Low64());
    r.token_ids = st->token_ids;
  } else if (const auto* rm = std::get_if<BlockRemoved>(&ev)) {
    r.kind = kRemove;
    r.medium = rm->medium.value_or(kMediumGpu);
    r.ownership = rm->ownership.value_or("");
    r.group = rm->group_idx.value_or(0);
    r.hashes.reserve(rm->block_hashes.size());
    for (const BlockHash& h : rm->block_hashes) r.hashes.push_back(h.Low64());
  } else {
    r.kind = kClearAll;
    r.medium = kMediumGpu;
  }
  return r;
}

}  // namespace

std::vector<LogRow> Indexer::Impl::ConvertBatch(std::string_view source, int64_t dp_rank,
                                                uint64_t seq, const EventBatch& batch, double now,
                                                ApplyOutcome* out) {
  std::vector<LogRow> rows;
  rows.reserve(batch.events.size());
  BatchNeeds needs;
  for (const KvEvent& ev : batch.events) {
    LogRow r = ToLogRow(ev, dp_rank, seq, batch.ts, now);
    // One event that does not fit is left out, not the batch: refusing the batch dropped its
    // removals too (and the stream moves on to the next seq), leaving entries for blocks the
    // engine had freed.
    if (Status fits = CheckRowFits(r, source, &needs); !fits.ok()) {
      if (out->refused_events++ == 0) out->refused_reason = fits.message();
      ++counters.refused_events;
      continue;
    }
    rows.push_back(std::move(r));
  }
  return rows;
}

Status Indexer::Impl::CheckRowFits(const LogRow& r, std::string_view source,
                                   BatchNeeds* needs) const {
  const std::string key = ResidencyKey(r.medium, r.ownership);
  if (key.size() > indexer_internal::kMaxMediumNameBytes) {
    return Status::InvalidArgument("source '" + std::string(source) + "': a medium name" +
                                   (r.ownership.empty() ? "" : " and ownership") + " of " +
                                   std::to_string(key.size()) + " bytes (at most " +
                                   std::to_string(indexer_internal::kMaxMediumNameBytes) +
                                   "); that event is left out");
  }
  if (r.medium.find(kOwnerSep) != std::string::npos ||
      r.ownership.find(kOwnerSep) != std::string::npos) {
    return Status::InvalidArgument("source '" + std::string(source) +
                                   "': a medium or ownership name holds a control "
                                   "character (0x1f); that event is left out");
  }
  const bool new_medium = mem.FindMedium(key) == UINT32_MAX && !needs->new_media.contains(key);
  const bool new_group =
      mem.FindGroup(r.group) == UINT32_MAX && !needs->new_groups.contains(r.group);
  if (mem.medium_count() + needs->new_media.size() + (new_medium ? 1 : 0) >
          indexer_internal::kMaxMedia ||
      mem.group_count() + needs->new_groups.size() + (new_group ? 1 : 0) >
          indexer_internal::kMaxGroups) {
    return Status::OutOfRange(
        // No seq in the text: the service's repeat filter folds a run of such refusals into
        // one line, and its log line names the batch.
        "source '" + std::string(source) + "': an event would exceed the index's " +
        std::to_string(indexer_internal::kMaxMedia) + " media or " +
        std::to_string(indexer_internal::kMaxGroups) + " KV-cache groups (medium '" + r.medium +
        "', group " + std::to_string(r.group) + "); that event is left out");
  }
  if (new_medium) needs->new_media.insert(key);
  if (new_group) needs->new_groups.insert(r.group);
  return Status::Ok();
}

Result<uint32_t> Indexer::Impl::RegisterBatch(std::string_view source,
                                              std::optional<uint32_t> known_sid, int64_t dp_rank,
                                              std::vector<LogRow>* rows) {
  uint32_t sid = 0;
  if (known_sid) {
    sid = *known_sid;
  } else {
    sid = SourceId(source, true);
    new_sources.emplace_back(sid, std::string(source));
  }
  if (mem.InstanceId(sid, dp_rank) == UINT32_MAX) {
    return Status::Internal("instance registry refused a validated stream");
  }
  for (LogRow& r : *rows) {
    r.source_id = sid;
    if (mem.MediumId(ResidencyKey(r.medium, r.ownership)) == UINT32_MAX ||
        mem.GroupId(r.group) == UINT32_MAX) {
      return Status::Internal("medium/group registry refused a validated batch");
    }
  }
  return sid;
}

void Indexer::Impl::KeyByContent(LogRow* r) {
  if (r->kind != kStore) return;
  r->content_keys.assign(r->hashes.size(), 0);
  if (r->token_ids.empty()) {
    KeyPlaceholders(r);
  } else if (r->TokensSliceIntoBlocks()) {
    KeyByTokens(r);
  } else {
    ++counters.content_mismatches;
  }
  // A block whose own content could not be keyed (unresolved parent, token mismatch) still gets
  // the key its node already has, so the log (and a rebuild from it) holds what memory holds.
  for (size_t i = 0; i < r->hashes.size(); ++i) {
    if (r->content_keys[i] == 0) r->content_keys[i] = NodeKeyOf(r->hashes[i]);
  }
}

uint64_t Indexer::Impl::NodeKeyOf(uint64_t engine_hash) const {
  const uint32_t node = mem.NodeByEngine(engine_hash);
  return node == kNoNode ? 0 : mem.NodeContentKey(node);
}

void Indexer::Impl::KeyPlaceholders(LogRow* r) {
  // No tokens: the content key of the node with that engine hash (llm-d's engine-key map).
  for (size_t i = 0; i < r->hashes.size(); ++i) {
    r->content_keys[i] = NodeKeyOf(r->hashes[i]);
    if (r->content_keys[i] != 0) {
      ++counters.placeholders_resolved;
    } else {
      ++counters.placeholders_unresolved;
    }
  }
}

void Indexer::Impl::KeyByTokens(LogRow* r) {
  uint64_t key = r->parent ? NodeKeyOf(*r->parent) : ContentKeyRoot(r->lora_name.value_or(""));
  if (key == 0) {
    ++counters.unresolved_parents;
    return;
  }
  ChainContentKeys(key, r->token_ids.data(), static_cast<size_t>(r->block_size), r->hashes.size(),
                   r->content_keys.data());
}

void Indexer::Impl::AdvanceStream(uint32_t sid, int64_t dp_rank, uint64_t seq, double ts,
                                  ApplyOutcome* out) {
  StreamState& s = streams[{sid, dp_rank}];
  s.last_seq = seq;
  s.last_ts = ts;
  s.dirty = true;
  ++counters.batches_applied;
  out->applied = true;
  tick.fetch_add(1, std::memory_order_relaxed);
  EvictIfNeeded();
}

bool Indexer::Impl::QueueRows(std::vector<LogRow>* rows) {
  if (pending.empty()) pending_since_ns = clock->MonotonicNanos();
  for (LogRow& r : *rows) pending.push_back(std::move(r));
  const bool due = pending.size() >= opt.flush_max_events ||
                   clock->MonotonicNanos() - pending_since_ns >= opt.flush_interval_ms * 1'000'000;
  if (!bg.joinable()) return due;
  // The background thread commits; the caller commits itself only as back-pressure.
  if (due) bg_cv.Signal();
  return pending.size() >= 4 * opt.flush_max_events;
}

Status Indexer::ClearSource(std::string_view source) { return impl_->Clear(source, std::nullopt); }

Status Indexer::ClearStream(std::string_view source, int64_t dp_rank) {
  return impl_->Clear(source, dp_rank);
}

namespace {
// A clear works in steps so that readers (and /healthz, /metrics, /v1/sources) never wait for
// it: SQL transactions of at most kClearDeleteRows rows, memory steps of kClearSlots slots.
constexpr int64_t kClearDeleteRows = 4096;
constexpr size_t kClearSlots = size_t{1} << 11;

std::string ClearMarker(uint32_t sid, std::optional<int64_t> rank) {
  return "clearing:" + std::to_string(sid) + ":" + (rank ? std::to_string(*rank) : "*");
}
}  // namespace

Status Indexer::Impl::Clear(std::string_view source, std::optional<int64_t> rank) {
  if (opt.read_only) return Status::FailedPrecondition("index '" + path + "' is read-only");
  ClearKey key{};
  {
    ReaderLock l(&state_mu);
    auto it = source_ids.find(source);
    if (it == source_ids.end()) return Status::Ok();
    key.sid = it->second;
  }
  key.rank = rank;
  const std::string marker = ClearMarker(key.sid, rank);
  int64_t fold_upto = 0;
  std::vector<uint32_t> hidden;
  // Step 1 (brief): flush, then in one transaction drop the checkpoint and write the marker that
  // makes an interrupted clear finish at the next Open; hide the stream from readers at once.
  for (;;) {
    {
      MutexLock c(&clear_mu);
      for (;;) {
        bool overlap = false;
        for (const ClearKey& k : clearing) overlap |= k.Overlaps(key);
        if (!overlap) break;
        clear_cv.Wait();
      }
    }
    MutexLock db_lock(&db_mu);
    MutexLock ingest_lock(&ingest_mu);
    {
      MutexLock c(&clear_mu);
      bool overlap = false;
      for (const ClearKey& k : clearing) overlap |= k.Overlaps(key);
      if (overlap) continue;  // another clear of it started meanwhile: wait for it
      clearing.push_back(key);
    }
    auto unmark = [&] {
      {
        MutexLock c(&clear_mu);
        for (size_t i = 0; i < clearing.size(); ++i) {
          if (clearing[i].sid == key.sid && clearing[i].rank == key.rank) {
            clearing.erase(clearing.begin() + static_cast<long>(i));
            break;
          }
        }
      }
      clear_cv.SignalAll();
    };
    Status s = FlushHoldingIngest();
    if (s.ok()) s = Exec(db, "BEGIN IMMEDIATE", path);
    if (s.ok()) {
      Stmt q;
      s = q.Prepare(db, "SELECT coalesce(max(id), 0) FROM event_log");
      if (s.ok() && q.Step() == SQLITE_ROW) fold_upto = q.ColInt(0);
      Stmt m;
      if (s.ok()) {
        s = m.Prepare(db, "INSERT OR REPLACE INTO kvo_index_meta (key, value) VALUES (?, ?)");
      }
      if (s.ok()) {
        m.Text(1, marker);
        m.Text(2, std::to_string(fold_upto));
        s = StepDone(db, m, path, "recording a clear");
      }
      Stmt d;
      if (s.ok()) {
        s = d.Prepare(db, rank ? "DELETE FROM streams WHERE source_id = ? AND dp_rank = ?"
                               : "DELETE FROM streams WHERE source_id = ?");
      }
      if (s.ok()) {
        d.Int(1, key.sid);
        if (rank) d.Int(2, *rank);
        s = StepDone(db, d, path, "clearing a checkpoint");
      }
      if (s.ok()) s = Exec(db, "COMMIT", path);
      if (!s.ok()) (void)Exec(db, "ROLLBACK", path);
    }
    if (!s.ok()) {
      unmark();
      return s;
    }
    WriterLock l(&state_mu);
    for (uint32_t inst = 0; inst < mem.instance_count(); ++inst) {
      if (key.Covers(mem.InstanceSource(inst), mem.InstanceRank(inst))) {
        mem.SetHidden(inst, true);
        hidden.push_back(inst);
      }
    }
    for (auto it = streams.begin(); it != streams.end();) {
      it = key.Covers(it->first.first, it->first.second) ? streams.erase(it) : std::next(it);
    }
    break;
  }
  // Step 2: SQL in bounded transactions (db_mu per chunk; ingest of other streams continues).
  Status sql = ClearSql(key, fold_upto);
  // Step 3: memory in bounded steps under the writer lock, released between steps. Passes
  // repeat while entries remain (other writers' inserts and erasures move slots); past a bound,
  // one full sweep finishes.
  {
    size_t cursor = 0;
    size_t steps = 0;
    size_t max_steps = 0;
    for (;;) {
      WriterLock l(&state_mu);
      int64_t left = 0;
      for (uint32_t inst : hidden) left += mem.InstanceEntries(inst);
      if (left == 0) break;
      const MemoryIndex* index = &mem;
      auto pred = [index, &key](uint32_t inst) {
        return index->Hidden(inst) &&
               key.Covers(index->InstanceSource(inst), index->InstanceRank(inst));
      };
      if (max_steps == 0) max_steps = 8 * (1 + mem.HoldingSlots() / kClearSlots);
      if (++steps > max_steps) {
        mem.ClearWhere(pred, UINT32_MAX);
        break;
      }
      mem.ClearSlots(pred, &cursor, kClearSlots);
    }
  }
  {
    WriterLock l(&state_mu);
    for (uint32_t inst : hidden) mem.SetHidden(inst, false);
    ++counters.source_clears;
  }
  {
    MutexLock c(&clear_mu);
    for (size_t i = 0; i < clearing.size(); ++i) {
      if (clearing[i].sid == key.sid && clearing[i].rank == key.rank) {
        clearing.erase(clearing.begin() + static_cast<long>(i));
        break;
      }
    }
  }
  clear_cv.SignalAll();
  return sql;
}

Status Indexer::Impl::ClearSql(const ClearKey& key, int64_t fold_upto) {
  // Fold the log up to the clear first: a content key this stream's stores gave to blocks that
  // other streams hold reaches their rows (the keyless back-fill) before this stream's rows go.
  // The stream's own rows are all <= fold_upto (its ingest waits for the clear).
  for (;;) {
    MutexLock db_lock(&db_mu);
    Stmt q;
    KVO_RETURN_IF_ERROR(q.Prepare(db, "SELECT min(id) FROM event_log"));
    if (q.Step() != SQLITE_ROW || q.ColNull(0) || q.ColInt(0) > fold_upto) break;
    const int64_t first = q.ColInt(0);
    int64_t folded = 0;
    KVO_RETURN_IF_ERROR(
        CompactChunk(std::min(opt.compact_chunk_rows, fold_upto - first + 1), &folded));
    if (folded == 0) break;
  }
  const std::string where =
      std::string("source_id = ?") + (key.rank.has_value() ? " AND dp_rank = ?" : "");
  const std::string del_rows = "DELETE FROM event_log WHERE " + where + " AND id <= ?";
  // Each step deletes the first kClearDeleteRows rows of the stream in key order: the boundary
  // key is found through the primary key, then a range delete (an IN (subquery) form made SQLite
  // visit every row of the stream per step: quadratic).
  // The primary key's order (schema v3: ownership after medium).
  const std::string cols = key.rank.has_value()
                               ? "medium, ownership, group_idx, engine_hash"
                               : "dp_rank, medium, ownership, group_idx, engine_hash";
  const int ncols = key.rank.has_value() ? 4 : 5;
  const std::string sel_bound = "SELECT " + cols + " FROM blocks WHERE " + where + " ORDER BY " +
                                cols + " LIMIT 1 OFFSET " + std::to_string(kClearDeleteRows - 1);
  const std::string del_upto = "DELETE FROM blocks WHERE " + where + " AND (" + cols + ") <= (" +
                               (ncols == 4 ? "?, ?, ?, ?" : "?, ?, ?, ?, ?") + ")";
  const std::string del_rest = "DELETE FROM blocks WHERE " + where;
  for (;;) {
    MutexLock db_lock(&db_mu);
    Stmt b;
    KVO_RETURN_IF_ERROR(b.Prepare(db, sel_bound.c_str()));
    b.Int(1, key.sid);
    if (key.rank) b.Int(2, *key.rank);
    const int first_col = key.rank ? 3 : 2;
    Stmt st;
    bool last = false;
    const int rc = b.Step();
    if (rc == SQLITE_ROW) {
      KVO_RETURN_IF_ERROR(st.Prepare(db, del_upto.c_str()));
      st.Int(1, key.sid);
      if (key.rank) st.Int(2, *key.rank);
      int i = first_col;
      if (!key.rank) st.Int(i++, b.ColInt(0));
      const int off = key.rank ? 0 : 1;
      st.Text(i++, b.ColText(off));
      st.Text(i++, b.ColText(off + 1));
      st.Int(i++, b.ColInt(off + 2));
      st.Int(i++, b.ColInt(off + 3));
    } else if (rc == SQLITE_DONE) {
      last = true;
      KVO_RETURN_IF_ERROR(st.Prepare(db, del_rest.c_str()));
      st.Int(1, key.sid);
      if (key.rank) st.Int(2, *key.rank);
    } else {
      return Status::IOError("index '" + path +
                             "': reading a stream's blocks: " + sqlite3_errmsg(db));
    }
    b.Reset();
    KVO_RETURN_IF_ERROR(Exec(db, "BEGIN IMMEDIATE", path));
    Status s = StepDone(db, st, path, "clearing a stream's blocks");
    if (s.ok()) s = Exec(db, "COMMIT", path);
    if (!s.ok()) {
      (void)Exec(db, "ROLLBACK", path);
      return s;
    }
    if (last) break;
  }
  MutexLock db_lock(&db_mu);
  KVO_RETURN_IF_ERROR(Exec(db, "BEGIN IMMEDIATE", path));
  Status s;
  {
    // Rows of the stream left in the log (none unless a fold above failed half-way).
    Stmt st;
    s = st.Prepare(db, del_rows.c_str());
    if (s.ok()) {
      st.Int(1, key.sid);
      int i = 2;
      if (key.rank) st.Int(i++, *key.rank);
      st.Int(i, fold_upto);
      s = StepDone(db, st, path, "clearing a stream's log rows");
      if (s.ok()) log_rows -= sqlite3_changes(db);
    }
    Stmt m;
    if (s.ok()) s = m.Prepare(db, "DELETE FROM kvo_index_meta WHERE key = ?");
    if (s.ok()) {
      m.Text(1, ClearMarker(key.sid, key.rank));
      s = StepDone(db, m, path, "finishing a clear");
    }
  }
  if (s.ok()) s = Exec(db, "COMMIT", path);
  if (!s.ok()) {
    (void)Exec(db, "ROLLBACK", path);
    return s;
  }
  log_rows_pending = log_rows;
  UpdateSqliteBytes();
  return Status::Ok();
}

Result<std::vector<std::pair<Indexer::Impl::ClearKey, int64_t>>> Indexer::Impl::ReadClearMarkers() {
  std::vector<std::pair<ClearKey, int64_t>> out;
  Stmt q;
  KVO_RETURN_IF_ERROR(
      q.Prepare(db, "SELECT key, value FROM kvo_index_meta WHERE key LIKE 'clearing:%'"));
  while (q.Step() == SQLITE_ROW) {
    const std::string k = q.ColText(0);
    unsigned sid = 0;
    long long r = 0;
    ClearKey key{};
    if (std::sscanf(k.c_str(), "clearing:%u:%lld", &sid, &r) == 2) {
      key.rank = r;
    } else if (std::sscanf(k.c_str(), "clearing:%u:*", &sid) != 1) {
      return Status::Corruption("index '" + path + "': unreadable clear marker");
    }
    key.sid = sid;
    out.emplace_back(key, std::atoll(q.ColText(1).c_str()));
  }
  return out;
}

Status Indexer::Impl::ResumeClears() {
  std::vector<std::pair<ClearKey, int64_t>> todo;
  {
    MutexLock db_lock(&db_mu);
    KVO_ASSIGN_OR_RETURN(todo, ReadClearMarkers());
    if (todo.empty()) return Status::Ok();
    Stmt c;
    KVO_RETURN_IF_ERROR(c.Prepare(db, "SELECT count(*) FROM event_log"));
    log_rows = c.Step() == SQLITE_ROW ? c.ColInt(0) : 0;
  }
  for (const auto& [key, upto] : todo) {
    KVO_LOG_INFO("indexer '{}': finishing a clear a restart interrupted (source id {})", path,
                 key.sid);
    {
      // The checkpoint went in the marker's transaction; rows may have followed a clear whose
      // SQL part failed, so the whole log is folded and every row of the stream goes.
      MutexLock db_lock(&db_mu);
      const std::string sql = std::string("DELETE FROM streams WHERE source_id = ?") +
                              (key.rank ? " AND dp_rank = ?" : "");
      Stmt d;
      KVO_RETURN_IF_ERROR(d.Prepare(db, sql.c_str()));
      d.Int(1, key.sid);
      if (key.rank) d.Int(2, *key.rank);
      KVO_RETURN_IF_ERROR(StepDone(db, d, path, "clearing a checkpoint"));
    }
    (void)upto;
    KVO_RETURN_IF_ERROR(ClearSql(key, INT64_MAX));
  }
  return Status::Ok();
}

}  // namespace kvo
