// Internal to indexer/: the state behind Indexer (Indexer::Impl) and the helpers its source
// files share: indexer.cc (the SQLite store: schema, open/migrate, load, registrations),
// commit.cc (flush, compaction), ingest.cc (ApplyBatch and the clears) and query.cc (scores,
// explain, stats, dump).
// See indexer/DESIGN.md for the state, the locking rule and the invariants.
#pragma once

#include <sqlite3.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "indexer/indexer.h"
#include "indexer/internal/memory_index.h"

namespace kvo {
namespace indexer_internal {

inline constexpr char kOwnerSep = '\x1f';
inline std::string ResidencyKey(const std::string& medium, const std::string& ownership) {
  return ownership.empty() ? medium : medium + kOwnerSep + ownership;
}
inline std::string MediumOfKey(const std::string& key) {
  return key.substr(0, key.find(kOwnerSep));
}
inline std::string OwnershipOfKey(const std::string& key) {
  const size_t sep = key.find(kOwnerSep);
  return sep == std::string::npos ? std::string() : key.substr(sep + 1);
}
// How scores and stats name a residency: "CPU", or "CPU/kvcr" for an owned copy.
inline std::string ResidencyDisplay(const std::string& key) {
  std::string out = key;
  const size_t sep = out.find(kOwnerSep);
  if (sep != std::string::npos) out[sep] = '/';
  return out;
}

enum RowKind : int64_t { kStore = 1, kRemove = 2, kClearAll = 3 };

// ---- little-endian blobs ----
inline void PutU64(std::string* out, uint64_t v) {
  char b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>(v >> (8 * i));
  out->append(b, 8);
}
inline uint64_t GetU64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}
inline uint32_t GetU32(const unsigned char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{p[i]} << (8 * i);
  return v;
}

// ---- SQLite adapter ----
class Stmt {
 public:
  Stmt() = default;
  ~Stmt() { sqlite3_finalize(s_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;

  Status Prepare(sqlite3* db, const char* sql) {
    sqlite3_finalize(s_);
    s_ = nullptr;
    if (sqlite3_prepare_v3(db, sql, -1, SQLITE_PREPARE_PERSISTENT, &s_, nullptr) != SQLITE_OK) {
      return Status::Internal(std::string("sqlite prepare failed: ") + sqlite3_errmsg(db) +
                              " in: " + sql);
    }
    return Status::Ok();
  }
  sqlite3_stmt* get() { return s_; }
  void Int(int i, int64_t v) { sqlite3_bind_int64(s_, i, v); }
  void U64(int i, uint64_t v) { sqlite3_bind_int64(s_, i, static_cast<int64_t>(v)); }
  void Real(int i, double v) { sqlite3_bind_double(s_, i, v); }
  void Null(int i) { sqlite3_bind_null(s_, i); }
  void Text(int i, std::string_view v) {
    sqlite3_bind_text(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
  }
  void Blob(int i, const void* p, size_t n) {
    if (n == 0) {
      sqlite3_bind_null(s_, i);
    } else {
      sqlite3_bind_blob(s_, i, p, static_cast<int>(n), SQLITE_STATIC);
    }
  }
  int Step() { return sqlite3_step(s_); }
  void Reset() {
    sqlite3_reset(s_);
    sqlite3_clear_bindings(s_);
  }
  int64_t ColInt(int i) { return sqlite3_column_int64(s_, i); }
  double ColReal(int i) { return sqlite3_column_double(s_, i); }
  bool ColNull(int i) { return sqlite3_column_type(s_, i) == SQLITE_NULL; }
  std::string ColText(int i) {
    const unsigned char* t = sqlite3_column_text(s_, i);
    return t ? std::string(reinterpret_cast<const char*>(t), sqlite3_column_bytes(s_, i))
             : std::string();
  }
  std::string ColBlob(int i) {
    const void* b = sqlite3_column_blob(s_, i);
    return b ? std::string(static_cast<const char*>(b), sqlite3_column_bytes(s_, i))
             : std::string();
  }

 private:
  sqlite3_stmt* s_ = nullptr;
};

inline Status Exec(sqlite3* db, const char* sql, const std::string& path) {
  char* err = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : sqlite3_errmsg(db);
    sqlite3_free(err);
    return Status::IOError("index '" + path + "': " + msg +
                           " (in: " + std::string(sql).substr(0, 80) + ")");
  }
  return Status::Ok();
}

inline Status StepDone(sqlite3* db, Stmt& st, const std::string& path, const char* what) {
  const int rc = st.Step();
  st.Reset();
  if (rc != SQLITE_DONE && rc != SQLITE_ROW) {
    return Status::IOError("index '" + path + "': " + what + ": " + sqlite3_errmsg(db));
  }
  return Status::Ok();
}

// One applied event, as it goes into event_log.
struct LogRow {
  uint32_t source_id = 0;
  int64_t dp_rank = 0;
  uint64_t seq = 0;
  double ts = 0;
  double seen_at = 0;
  int64_t kind = kStore;
  std::string medium;
  std::string ownership;  // "" = the framework's copy
  int64_t group = 0;
  int64_t block_size = 0;
  std::optional<std::string> lora_name;
  std::optional<uint64_t> parent;
  std::vector<uint64_t> hashes;
  std::vector<uint64_t> content_keys;  // stores only; 0 = not content-keyed
  std::vector<int64_t> token_ids;      // stores only

  // A store whose tokens are exactly `block_size` per hash, so each block's slice can be keyed.
  // Division, not multiplication: a hostile block_size makes `hashes * block_size` wrap around to
  // the token count (3 hashes, 2 tokens, block_size 6148914691236517206) and then a slice of
  // ~10^19 tokens is read.
  bool TokensSliceIntoBlocks() const {
    return block_size > 0 && !token_ids.empty() &&
           token_ids.size() % static_cast<uint64_t>(block_size) == 0 &&
           token_ids.size() / static_cast<uint64_t>(block_size) == hashes.size();
  }
};

inline std::string EncodeU64s(const std::vector<uint64_t>& v) {
  std::string out;
  out.reserve(v.size() * 8);
  for (uint64_t x : v) PutU64(&out, x);
  return out;
}
inline int EncodeTokens(const std::vector<int64_t>& t, std::string* out) {
  out->clear();
  if (t.empty()) return 0;
  const bool narrow =
      std::all_of(t.begin(), t.end(), [](int64_t x) { return x >= INT32_MIN && x <= INT32_MAX; });
  if (narrow) {
    out->resize(t.size() * 4);
    for (size_t i = 0; i < t.size(); ++i) {
      const uint32_t v = static_cast<uint32_t>(static_cast<int32_t>(t[i]));
      for (int b = 0; b < 4; ++b) (*out)[i * 4 + b] = static_cast<char>(v >> (8 * b));
    }
    return 4;
  }
  for (int64_t x : t) PutU64(out, static_cast<uint64_t>(x));
  return 8;
}
inline std::vector<uint64_t> DecodeU64s(const std::string& b) {
  std::vector<uint64_t> v(b.size() / 8);
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = GetU64(reinterpret_cast<const unsigned char*>(b.data()) + 8 * i);
  return v;
}
inline std::vector<int64_t> DecodeTokens(const std::string& b, int width) {
  std::vector<int64_t> v;
  const auto* p = reinterpret_cast<const unsigned char*>(b.data());
  if (width == 4) {
    v.resize(b.size() / 4);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int32_t>(GetU32(p + 4 * i));
  } else if (width == 8) {
    v.resize(b.size() / 8);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int64_t>(GetU64(p + 8 * i));
  }
  return v;
}

// One event_log row, as `sel_log` and Load's query select it (id first).
inline LogRow ReadLogRow(Stmt& st, int64_t* id) {
  LogRow r;
  *id = st.ColInt(0);
  r.source_id = static_cast<uint32_t>(st.ColInt(1));
  r.dp_rank = st.ColInt(2);
  r.seq = static_cast<uint64_t>(st.ColInt(3));
  r.ts = st.ColReal(4);
  r.seen_at = st.ColReal(5);
  r.kind = st.ColInt(6);
  r.medium = st.ColText(7);
  r.group = st.ColInt(8);
  r.block_size = st.ColInt(9);
  if (!st.ColNull(10)) r.lora_name = st.ColText(10);
  if (!st.ColNull(11)) r.parent = static_cast<uint64_t>(st.ColInt(11));
  r.hashes = DecodeU64s(st.ColBlob(12));
  r.content_keys = DecodeU64s(st.ColBlob(13));
  r.token_ids = DecodeTokens(st.ColBlob(15), static_cast<int>(st.ColInt(14)));
  r.ownership = st.ColText(16);
  if (r.kind == kStore) r.content_keys.resize(r.hashes.size(), 0);
  return r;
}

// What ApplyBatch's admission step decides (ingest.cc).
enum class Admission {
  kApply,     // go on: convert, register, apply
  kReplayed,  // seq <= the stream's last sequence: skipped (replay overlap)
  kClearing,  // the stream is being cleared: wait for the clear, then try again
};

struct StreamState {
  uint64_t last_seq = 0;
  double last_ts = 0;
  uint64_t durable_seq = 0;
  bool dirty = false;
};

inline double DefaultWeight(const std::string& medium) {
  if (medium == kMediumGpu) return 1.0;
  if (medium == kMediumCpu) return 0.8;
  if (medium == kMediumStorage) return 0.5;
  return 1.0;
}

}  // namespace indexer_internal

struct Indexer::Impl {
  std::string path;
  IndexerOptions opt;
  // The file's schema version after Open's migrations (older only when opened read-only).
  int64_t file_version = Indexer::kSchemaVersion;
  Clock* clock = nullptr;
  sqlite3* db = nullptr;

  // Lock order: db_mu, then ingest_mu, then state_mu.
  Mutex db_mu;  // the SQLite connection, its statements, log_rows
  Mutex ingest_mu;
  std::vector<indexer_internal::LogRow> pending GUARDED_BY(ingest_mu);
  int64_t pending_since_ns GUARDED_BY(ingest_mu) = 0;
  std::vector<std::pair<uint32_t, std::string>> new_sources GUARDED_BY(ingest_mu);
  int64_t log_rows GUARDED_BY(db_mu) = 0;
  indexer_internal::Stmt ins_source, ins_log, up_stream, sel_log, ups_block, dec_block, del_block,
      clr_block, set_ck, del_log;

  // Streams being cleared (ClearSource: rank nullopt). clear_mu is a leaf lock: taken under
  // ingest_mu (ApplyBatch, Clear's first step) or alone (waiting), never the other way round.
  struct ClearKey {
    uint32_t sid = 0;
    std::optional<int64_t> rank;
    bool Covers(uint32_t s, int64_t r) const { return s == sid && (!rank || *rank == r); }
    bool Overlaps(const ClearKey& o) const {
      return sid == o.sid && (!rank || !o.rank || *rank == *o.rank);
    }
  };
  Mutex clear_mu;
  CondVar clear_cv{&clear_mu};
  std::vector<ClearKey> clearing GUARDED_BY(clear_mu);
  // page_count * page_size after the last write (Stats never waits for the connection).
  std::atomic<int64_t> sqlite_bytes{0};

  mutable SharedMutex state_mu;
  indexer_internal::MemoryIndex mem GUARDED_BY(state_mu);
  std::vector<std::string> source_names GUARDED_BY(state_mu);
  std::map<std::string, uint32_t, std::less<>> source_ids GUARDED_BY(state_mu);
  std::map<std::pair<uint32_t, int64_t>, indexer_internal::StreamState> streams
      GUARDED_BY(state_mu);
  IndexerCounters counters GUARDED_BY(state_mu);
  std::atomic<int64_t> log_rows_pending{0};
  mutable std::atomic<int64_t> scores{0};
  mutable std::atomic<uint32_t> tick{1};
  // Load: every kLoadChunkRows rows read, a later LRU tick and the byte budget applied
  // (LoadStep); load_peak_bytes is the scoring structure's largest budget size meanwhile.
  static constexpr int64_t kLoadChunkRows = 1024;
  size_t load_peak_bytes GUARDED_BY(state_mu) = 0;
  void LoadStep(int64_t row) EXCLUSIVE_LOCKS_REQUIRED(state_mu);

  Mutex bg_mu;
  CondVar bg_cv{&bg_mu};
  bool stop GUARDED_BY(bg_mu) = false;
  std::thread bg;

  ~Impl() {
    if (db) sqlite3_close_v2(db);
  }

  Status OpenDb();
  // ApplyBatch's steps (ingest.cc; which lock each holds: indexer/DESIGN.md "ApplyBatch, step
  // by step").
  Status CheckBatchArgs(std::string_view source, int64_t dp_rank, uint64_t seq) const;
  // Steps 2-7; takes the locks itself.
  Result<indexer_internal::Admission> RunIngestSteps(std::string_view source, int64_t dp_rank,
                                                     uint64_t seq, const EventBatch& batch,
                                                     ApplyOutcome* out, bool* must_flush)
      LOCKS_EXCLUDED(ingest_mu, state_mu);
  Result<indexer_internal::Admission> AdmitBatch(std::string_view source, int64_t dp_rank,
                                                 uint64_t seq, std::optional<uint32_t>* known_sid)
      EXCLUSIVE_LOCKS_REQUIRED(ingest_mu, state_mu);
  // What a batch would add to the index's media and groups (checked before anything changes).
  struct BatchNeeds {
    std::set<std::string> new_media;
    std::set<int64_t> new_groups;
  };
  // The batch's events as log rows; an event that does not fit the index is left out and
  // counted in *out (its first reason kept).
  std::vector<indexer_internal::LogRow> ConvertBatch(std::string_view source, int64_t dp_rank,
                                                     uint64_t seq, const EventBatch& batch,
                                                     double now, ApplyOutcome* out)
      EXCLUSIVE_LOCKS_REQUIRED(ingest_mu, state_mu);
  Status CheckRowFits(const indexer_internal::LogRow& r, std::string_view source,
                      BatchNeeds* needs) const EXCLUSIVE_LOCKS_REQUIRED(state_mu);
  // Cannot fail once ConvertBatch accepted the rows (an Internal error otherwise); the source id.
  Result<uint32_t> RegisterBatch(std::string_view source, std::optional<uint32_t> known_sid,
                                 int64_t dp_rank, std::vector<indexer_internal::LogRow>* rows)
      EXCLUSIVE_LOCKS_REQUIRED(ingest_mu, state_mu);
  // A store's content keys: by tokens chained from its parent's key, or (placeholders) the
  // node's; a block left unkeyed takes its node's key. Counts what could not be keyed.
  void KeyByContent(indexer_internal::LogRow* r) EXCLUSIVE_LOCKS_REQUIRED(state_mu);
  void KeyPlaceholders(indexer_internal::LogRow* r) EXCLUSIVE_LOCKS_REQUIRED(state_mu);
  void KeyByTokens(indexer_internal::LogRow* r) EXCLUSIVE_LOCKS_REQUIRED(state_mu);
  // The content key of the node with that engine hash; 0 for none.
  uint64_t NodeKeyOf(uint64_t engine_hash) const
      KVO_THREAD_ANNOTATION_(requires_shared_capability(state_mu));
  void AdvanceStream(uint32_t sid, int64_t dp_rank, uint64_t seq, double ts, ApplyOutcome* out)
      EXCLUSIVE_LOCKS_REQUIRED(state_mu);
  // Appends the rows to pending; true when the caller must flush itself (back-pressure, or no
  // background thread and a flush is due).
  bool QueueRows(std::vector<indexer_internal::LogRow>* rows) EXCLUSIVE_LOCKS_REQUIRED(ingest_mu);
  Status Load() EXCLUSIVE_LOCKS_REQUIRED(db_mu);
  Status Prepare();
  // Applies one row to memory and counts; the row's content keys are final.
  void ApplyRow(const indexer_internal::LogRow& row, ApplyOutcome* out)
      EXCLUSIVE_LOCKS_REQUIRED(state_mu);
  uint32_t SourceId(std::string_view name, bool create) EXCLUSIVE_LOCKS_REQUIRED(state_mu);
  // Takes the pending rows (under ingest_mu, briefly) and commits them (under db_mu only), so
  // ingest continues while SQLite writes. On failure the rows go back in front of pending.
  Status FlushLocked() EXCLUSIVE_LOCKS_REQUIRED(db_mu) LOCKS_EXCLUDED(ingest_mu);
  // The same with ingest_mu already held (ClearSource).
  Status FlushHoldingIngest() EXCLUSIVE_LOCKS_REQUIRED(db_mu, ingest_mu);
  struct Taken {
    std::vector<indexer_internal::LogRow> rows;
    std::vector<std::pair<uint32_t, std::string>> sources;
    std::vector<std::tuple<uint32_t, int64_t, uint64_t, double>> dirty;
  };
  Taken TakePending() EXCLUSIVE_LOCKS_REQUIRED(ingest_mu);
  void PutBack(Taken& t) EXCLUSIVE_LOCKS_REQUIRED(ingest_mu);
  Status Commit(const Taken& t) EXCLUSIVE_LOCKS_REQUIRED(db_mu);
  void MarkDurable(const Taken& t) EXCLUSIVE_LOCKS_REQUIRED(db_mu);
  Status CompactChunk(int64_t limit, int64_t* folded) EXCLUSIVE_LOCKS_REQUIRED(db_mu);
  Status FoldRow(const indexer_internal::LogRow& row);
  void EvictIfNeeded() EXCLUSIVE_LOCKS_REQUIRED(state_mu);
  Result<indexer_internal::BlockKeys> QueryKeys(const ScoreQuery& q, bool* by_engine,
                                                int64_t* block_size) const;
  // ClearSource (rank nullopt) and ClearStream.
  Status Clear(std::string_view source, std::optional<int64_t> rank);
  // The SQL part of a clear, in bounded transactions, db_mu taken per chunk: folds the log up to
  // `fold_upto` (id), deletes the stream's blocks, then its marker.
  Status ClearSql(const ClearKey& key, int64_t fold_upto) LOCKS_EXCLUDED(db_mu);
  // Finishes clears a crash interrupted (markers in kvo_index_meta), before Load.
  Status ResumeClears() LOCKS_EXCLUDED(db_mu);
  // Clear markers in the file (an interrupted clear): Load leaves those streams out.
  Result<std::vector<std::pair<ClearKey, int64_t>>> ReadClearMarkers()
      EXCLUSIVE_LOCKS_REQUIRED(db_mu);
  void UpdateSqliteBytes() EXCLUSIVE_LOCKS_REQUIRED(db_mu);
  bool ClearingCovers(uint32_t sid, int64_t rank) LOCKS_EXCLUDED(clear_mu) {
    MutexLock c(&clear_mu);
    for (const ClearKey& k : clearing) {
      if (k.Covers(sid, rank)) return true;
    }
    return false;
  }
  void WaitUntilNotClearing(std::string_view source, int64_t rank)
      LOCKS_EXCLUDED(clear_mu, state_mu) {
    uint32_t sid;
    {
      ReaderLock l(&state_mu);
      auto it = source_ids.find(source);
      if (it == source_ids.end()) return;
      sid = it->second;
    }
    MutexLock c(&clear_mu);
    for (;;) {
      bool covered = false;
      for (const ClearKey& k : clearing) covered |= k.Covers(sid, rank);
      if (!covered) return;
      clear_cv.Wait();
    }
  }
  // Tiered's instance filter (every instance of `sources`, all when empty; unknown names are
  // skipped) and each medium's tier (0 GPU, 1 CPU, 2 STORAGE/DISK, 3 other).
  void TieredScope(const std::vector<std::string>& sources, std::vector<uint64_t>* filter,
                   std::vector<uint8_t>* tiers) const
      KVO_THREAD_ANNOTATION_(requires_shared_capability(state_mu));
  // Tiered's answer from the walk's boundaries: instances in the filter, not hidden, and either
  // holding something or on a stream still followed.
  std::vector<Indexer::TieredMatch> TieredMatches(const std::vector<std::array<int64_t, 3>>& bounds,
                                                  const std::vector<uint64_t>& filter) const
      KVO_THREAD_ANNOTATION_(requires_shared_capability(state_mu));
  Result<ScoreResult> ScoreLocked(const ScoreQuery& q, std::vector<uint64_t>* keys_out,
                                  bool* by_engine_out) const
      KVO_THREAD_ANNOTATION_(requires_shared_capability(state_mu));
  void BackgroundLoop();
};

}  // namespace kvo
