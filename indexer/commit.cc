// Indexer, the store's write path: flush (take the pending rows under ingest_mu, commit them
// under db_mu only) and compaction (fold the oldest log rows into `blocks` in bounded chunks).
// indexer.cc opens and loads the file. See indexer/DESIGN.md ("State and where it lives",
// "Locking rule").
#include "indexer/indexer.h"

#include <sqlite3.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <string>
#include <vector>

#include "indexer/indexer_internal.h"

namespace kvo {

using indexer_internal::EncodeTokens;
using indexer_internal::EncodeU64s;
using indexer_internal::Exec;
using indexer_internal::kClearAll;
using indexer_internal::kRemove;
using indexer_internal::kStore;
using indexer_internal::LogRow;
using indexer_internal::ReadLogRow;
using indexer_internal::StepDone;
using indexer_internal::Stmt;

// ---------------------------------------------------------------------------------------------
// Durability.

Indexer::Impl::Taken Indexer::Impl::TakePending() {
  Taken t;
  t.rows.swap(pending);
  t.sources.swap(new_sources);
  ReaderLock l(&state_mu);
  for (const auto& [key, st] : streams) {
    if (st.dirty) t.dirty.emplace_back(key.first, key.second, st.last_seq, st.last_ts);
  }
  return t;
}

void Indexer::Impl::PutBack(Taken& t) {
  t.rows.insert(t.rows.end(), std::make_move_iterator(pending.begin()),
                std::make_move_iterator(pending.end()));
  pending.swap(t.rows);
  t.sources.insert(t.sources.end(), new_sources.begin(), new_sources.end());
  new_sources.swap(t.sources);
}

Status Indexer::Impl::FlushLocked() {
  if (opt.read_only) return Status::Ok();
  Taken t;
  {
    MutexLock l(&ingest_mu);
    t = TakePending();
  }
  Status s = Commit(t);
  if (!s.ok()) {
    MutexLock l(&ingest_mu);
    PutBack(t);
    return s;
  }
  MarkDurable(t);
  return Status::Ok();
}

Status Indexer::Impl::FlushHoldingIngest() {
  if (opt.read_only) return Status::Ok();
  Taken t = TakePending();
  Status s = Commit(t);
  if (!s.ok()) {
    PutBack(t);
    return s;
  }
  MarkDurable(t);
  return Status::Ok();
}

Status Indexer::Impl::Commit(const Taken& t) {
  if (t.rows.empty() && t.dirty.empty() && t.sources.empty()) return Status::Ok();
  const double now = clock->NowSeconds();
  KVO_RETURN_IF_ERROR(Exec(db, "BEGIN IMMEDIATE", path));
  auto fail = [&](const char* what) {
    Status s = Status::IOError("index '" + path + "': " + what + ": " + sqlite3_errmsg(db));
    (void)Exec(db, "ROLLBACK", path);
    return s;
  };
  for (const auto& [id, name] : t.sources) {
    ins_source.Int(1, id);
    ins_source.Text(2, name);
    const int rc = ins_source.Step();
    ins_source.Reset();
    if (rc != SQLITE_DONE) return fail("inserting a source");
  }
  std::string hashes, keys, tokens;
  for (const LogRow& r : t.rows) {
    hashes = EncodeU64s(r.hashes);
    keys = EncodeU64s(r.content_keys);
    const int width = EncodeTokens(r.token_ids, &tokens);
    ins_log.Int(1, r.source_id);
    ins_log.Int(2, r.dp_rank);
    ins_log.U64(3, r.seq);
    ins_log.Real(4, r.ts);
    ins_log.Real(5, r.seen_at);
    ins_log.Int(6, r.kind);
    ins_log.Text(7, r.medium);
    ins_log.Int(8, r.group);
    ins_log.Int(9, r.block_size);
    if (r.lora_name) ins_log.Text(10, *r.lora_name);
    if (r.parent) ins_log.U64(11, *r.parent);
    ins_log.Blob(12, hashes.data(), hashes.size());
    ins_log.Blob(13, keys.data(), keys.size());
    ins_log.Int(14, width);
    ins_log.Blob(15, tokens.data(), tokens.size());
    ins_log.Text(16, r.ownership);
    const int rc = ins_log.Step();
    ins_log.Reset();
    if (rc != SQLITE_DONE) return fail("appending to event_log");
  }
  for (const auto& [sid, rank, seq, ts] : t.dirty) {
    up_stream.Int(1, sid);
    up_stream.Int(2, rank);
    up_stream.U64(3, seq);
    up_stream.Real(4, ts);
    up_stream.Real(5, now);
    const int rc = up_stream.Step();
    up_stream.Reset();
    if (rc != SQLITE_DONE) return fail("updating the stream checkpoint");
  }
  if (Status s = Exec(db, "COMMIT", path); !s.ok()) {
    (void)Exec(db, "ROLLBACK", path);
    return s;
  }
  return Status::Ok();
}

void Indexer::Impl::MarkDurable(const Taken& t) {
  log_rows += static_cast<int64_t>(t.rows.size());
  if (!t.rows.empty() || !t.dirty.empty()) UpdateSqliteBytes();
  log_rows_pending = log_rows;
  WriterLock l(&state_mu);
  for (const auto& [sid, rank, seq, ts] : t.dirty) {
    auto it = streams.find({sid, rank});
    if (it == streams.end()) continue;
    it->second.durable_seq = seq;
    if (it->second.last_seq == seq) it->second.dirty = false;
  }
  if (!t.rows.empty() || !t.dirty.empty()) ++counters.flushes;
}

Status Indexer::Impl::FoldRow(const LogRow& r) {
  auto done = [&](Stmt& st, const char* what) { return StepDone(db, st, path, what); };
  if (r.kind == kStore) {
    const size_t n = r.hashes.size();
    const bool sliced = r.TokensSliceIntoBlocks();
    std::string tokens;
    for (size_t i = 0; i < n; ++i) {
      int width = 0;
      if (sliced) {
        std::vector<int64_t> slice(r.token_ids.begin() + i * r.block_size,
                                   r.token_ids.begin() + (i + 1) * r.block_size);
        width = EncodeTokens(slice, &tokens);
      } else {
        tokens.clear();
      }
      ups_block.Int(1, r.source_id);
      ups_block.Int(2, r.dp_rank);
      ups_block.Text(3, r.medium);
      ups_block.Int(4, r.group);
      ups_block.U64(5, r.hashes[i]);
      if (i > 0) {
        ups_block.U64(6, r.hashes[i - 1]);
      } else if (r.parent) {
        ups_block.U64(6, *r.parent);
      }
      if (r.content_keys[i] != 0) ups_block.U64(7, r.content_keys[i]);
      ups_block.Int(8, r.block_size);
      ups_block.Int(9, sliced ? r.block_size : 0);
      ups_block.Int(10, width);
      ups_block.Blob(11, tokens.data(), tokens.size());
      if (r.lora_name) ups_block.Text(12, *r.lora_name);
      ups_block.U64(13, r.seq);
      ups_block.U64(14, r.seq);
      ups_block.Real(15, r.seen_at);
      ups_block.Real(16, r.seen_at);
      ups_block.Text(17, r.ownership);
      KVO_RETURN_IF_ERROR(done(ups_block, "folding a store"));
      if (r.content_keys[i] != 0) {
        set_ck.U64(1, r.content_keys[i]);
        set_ck.U64(2, r.hashes[i]);
        KVO_RETURN_IF_ERROR(done(set_ck, "setting a content key"));
      }
    }
  } else if (r.kind == kRemove) {
    for (uint64_t h : r.hashes) {
      for (Stmt* st : {&dec_block, &del_block}) {
        st->Int(1, r.source_id);
        st->Int(2, r.dp_rank);
        st->Text(3, r.medium);
        st->Int(4, r.group);
        st->U64(5, h);
        st->Text(6, r.ownership);
        KVO_RETURN_IF_ERROR(done(*st, "folding a removal"));
      }
    }
  } else if (r.kind == kClearAll) {
    clr_block.Int(1, r.source_id);
    clr_block.Int(2, r.dp_rank);
    clr_block.Text(3, r.medium);
    KVO_RETURN_IF_ERROR(done(clr_block, "folding a clear"));
  }
  return Status::Ok();
}

Status Indexer::Impl::CompactChunk(int64_t limit, int64_t* folded) {
  *folded = 0;
  KVO_RETURN_IF_ERROR(Exec(db, "BEGIN IMMEDIATE", path));
  Status s;
  int64_t last_id = -1;
  sel_log.Int(1, limit);
  int rc;
  std::vector<LogRow> rows;
  while ((rc = sel_log.Step()) == SQLITE_ROW) {
    int64_t id;
    rows.push_back(ReadLogRow(sel_log, &id));
    last_id = id;
  }
  sel_log.Reset();
  if (rc != SQLITE_DONE) {
    s = Status::IOError("index '" + path + "': reading event_log: " + sqlite3_errmsg(db));
  }
  for (size_t i = 0; s.ok() && i < rows.size(); ++i) s = FoldRow(rows[i]);
  if (s.ok() && last_id >= 0) {
    del_log.Int(1, last_id);
    s = StepDone(db, del_log, path, "deleting folded log rows");
  }
  if (s.ok()) s = Exec(db, "COMMIT", path);
  if (!s.ok()) {
    (void)Exec(db, "ROLLBACK", path);
    return s;
  }
  *folded = static_cast<int64_t>(rows.size());
  log_rows -= *folded;
  log_rows_pending = log_rows;
  UpdateSqliteBytes();
  WriterLock l(&state_mu);
  ++counters.compactions;
  return Status::Ok();
}

Status Indexer::Flush() {
  if (impl_->opt.read_only) {
    return Status::FailedPrecondition("index '" + impl_->path + "' is read-only");
  }
  MutexLock l(&impl_->db_mu);
  return impl_->FlushLocked();
}

Status Indexer::Compact(int64_t max_rows) {
  Impl& d = *impl_;
  if (d.opt.read_only) return Status::FailedPrecondition("index '" + d.path + "' is read-only");
  MutexLock l(&d.db_mu);
  KVO_RETURN_IF_ERROR(d.FlushLocked());
  int64_t left = max_rows < 0 ? INT64_MAX : max_rows;
  while (left > 0 && d.log_rows > 0) {
    int64_t folded = 0;
    KVO_RETURN_IF_ERROR(d.CompactChunk(std::min(left, d.opt.compact_chunk_rows), &folded));
    if (folded == 0) break;
    left -= folded;
  }
  return Status::Ok();
}

}  // namespace kvo
