// Indexer: SQLite durability (append-only log + compacted `blocks`) around MemoryIndex.
// See indexer/DESIGN.md for the state, the locking rule and the invariants.
#include "indexer/indexer.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <shared_mutex>
#include <thread>
#include <tuple>

#include "common/logging.h"
#include "common/mutex.h"
#include "indexer/memory_index.h"

namespace kvo {
namespace {

using indexer_internal::kNoNode;
using indexer_internal::MemoryIndex;

constexpr int64_t kApplicationId = 0x6B766F49;  // "kvoI"
constexpr char kSchemaSql[] =
#include "index_schema.inc"
    ;

// Version 1 -> 2: the registrations table (schemas/index.sql).
constexpr char kMigrateV1ToV2[] =
    "CREATE TABLE registrations (name TEXT PRIMARY KEY, body TEXT NOT NULL, "
    "created_at REAL NOT NULL) WITHOUT ROWID; PRAGMA user_version = 2;";
// Version 2 -> 3: `ownership` in event_log and blocks, part of the blocks key (a secondary tier's
// own copy is its own residency). Old rows are the framework's copies: ownership ''. blocks is
// rebuilt (its primary key changes); its index and the audit view are recreated.
constexpr char kMigrateV2ToV3[] =
    "ALTER TABLE event_log ADD COLUMN ownership TEXT NOT NULL DEFAULT ''; "
    "DROP VIEW block_entries; DROP INDEX blocks_keyless; "
    "ALTER TABLE blocks RENAME TO blocks_v2; "
    "CREATE TABLE blocks (source_id INTEGER NOT NULL, dp_rank INTEGER NOT NULL, "
    "medium TEXT NOT NULL, ownership TEXT NOT NULL DEFAULT '', group_idx INTEGER NOT NULL, "
    "engine_hash INTEGER NOT NULL, refcount INTEGER NOT NULL, parent_hash INTEGER, "
    "content_key INTEGER, block_size INTEGER NOT NULL, token_count INTEGER NOT NULL, "
    "token_width INTEGER NOT NULL DEFAULT 0, token_ids BLOB, lora_name TEXT, "
    "first_seq INTEGER NOT NULL, last_seq INTEGER NOT NULL, first_seen REAL NOT NULL, "
    "last_seen REAL NOT NULL, "
    "PRIMARY KEY (source_id, dp_rank, medium, ownership, group_idx, engine_hash)) WITHOUT ROWID; "
    "INSERT INTO blocks (source_id, dp_rank, medium, ownership, group_idx, engine_hash, refcount, "
    "parent_hash, content_key, block_size, token_count, token_width, token_ids, lora_name, "
    "first_seq, last_seq, first_seen, last_seen) "
    "SELECT source_id, dp_rank, medium, '', group_idx, engine_hash, refcount, parent_hash, "
    "content_key, block_size, token_count, token_width, token_ids, lora_name, first_seq, "
    "last_seq, first_seen, last_seen FROM blocks_v2; "
    "DROP TABLE blocks_v2; "
    "CREATE INDEX blocks_keyless ON blocks (engine_hash) WHERE content_key IS NULL; "
    "CREATE VIEW block_entries AS "
    "SELECT s.name AS source, b.dp_rank, b.medium, b.ownership, b.group_idx, "
    "printf('%016x', b.engine_hash) AS engine_hash_hex, "
    "printf('%016x', b.content_key) AS content_key_hex, "
    "printf('%016x', b.parent_hash) AS parent_hash_hex, "
    "b.refcount, b.block_size, b.token_count, b.lora_name, b.first_seq, b.last_seq, "
    "datetime(b.first_seen, 'unixepoch') AS first_seen_utc, "
    "datetime(b.last_seen, 'unixepoch') AS last_seen_utc "
    "FROM blocks b JOIN sources s USING (source_id); "
    "PRAGMA user_version = 3;";

// The in-memory key of a residency: the medium, or for a copy a secondary tier owns (vLLM's
// `ownership`, e.g. "kvcr") the medium and the owner, apart from the framework's copy.
constexpr char kOwnerSep = '\x1f';
std::string ResidencyKey(const std::string& medium, const std::string& ownership) {
  return ownership.empty() ? medium : medium + kOwnerSep + ownership;
}
std::string MediumOfKey(const std::string& key) { return key.substr(0, key.find(kOwnerSep)); }
std::string OwnershipOfKey(const std::string& key) {
  const size_t sep = key.find(kOwnerSep);
  return sep == std::string::npos ? std::string() : key.substr(sep + 1);
}
// How scores and stats name a residency: "CPU", or "CPU/kvcr" for an owned copy.
std::string ResidencyDisplay(const std::string& key) {
  std::string out = key;
  const size_t sep = out.find(kOwnerSep);
  if (sep != std::string::npos) out[sep] = '/';
  return out;
}

enum RowKind : int64_t { kStore = 1, kRemove = 2, kClearAll = 3 };

// An annotated reader/writer lock (common/mutex.h has only the exclusive kind).
class CAPABILITY("mutex") SharedMutex {
 public:
  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  void LockShared() KVO_THREAD_ANNOTATION_(acquire_shared_capability()) { mu_.lock_shared(); }
  void UnlockShared() KVO_THREAD_ANNOTATION_(release_shared_capability()) { mu_.unlock_shared(); }

 private:
  std::shared_mutex mu_;
};
class SCOPED_CAPABILITY WriterLock {
 public:
  explicit WriterLock(SharedMutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~WriterLock() RELEASE() { mu_->Unlock(); }

 private:
  SharedMutex* const mu_;
};
class SCOPED_CAPABILITY ReaderLock {
 public:
  explicit ReaderLock(SharedMutex* mu) KVO_THREAD_ANNOTATION_(acquire_shared_capability(mu))
      : mu_(mu) {
    mu_->LockShared();
  }
  ~ReaderLock() KVO_THREAD_ANNOTATION_(release_capability()) { mu_->UnlockShared(); }

 private:
  SharedMutex* const mu_;
};

// ---- little-endian blobs ----
void PutU64(std::string* out, uint64_t v) {
  char b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>(v >> (8 * i));
  out->append(b, 8);
}
uint64_t GetU64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}
uint32_t GetU32(const unsigned char* p) {
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

Status Exec(sqlite3* db, const char* sql, const std::string& path) {
  char* err = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : sqlite3_errmsg(db);
    sqlite3_free(err);
    return Status::IOError("index '" + path + "': " + msg +
                           " (in: " + std::string(sql).substr(0, 80) + ")");
  }
  return Status::Ok();
}

Status StepDone(sqlite3* db, Stmt& st, const std::string& path, const char* what) {
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
};

std::string EncodeU64s(const std::vector<uint64_t>& v) {
  std::string out;
  out.reserve(v.size() * 8);
  for (uint64_t x : v) PutU64(&out, x);
  return out;
}
int EncodeTokens(const std::vector<int64_t>& t, std::string* out) {
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
std::vector<uint64_t> DecodeU64s(const std::string& b) {
  std::vector<uint64_t> v(b.size() / 8);
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = GetU64(reinterpret_cast<const unsigned char*>(b.data()) + 8 * i);
  return v;
}
std::vector<int64_t> DecodeTokens(const std::string& b, int width) {
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

struct StreamState {
  uint64_t last_seq = 0;
  double last_ts = 0;
  uint64_t durable_seq = 0;
  bool dirty = false;
};

double DefaultWeight(const std::string& medium) {
  if (medium == kMediumGpu) return 1.0;
  if (medium == kMediumCpu) return 0.8;
  if (medium == kMediumStorage) return 0.5;
  return 1.0;
}

}  // namespace

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
  std::vector<LogRow> pending GUARDED_BY(ingest_mu);
  int64_t pending_since_ns GUARDED_BY(ingest_mu) = 0;
  std::vector<std::pair<uint32_t, std::string>> new_sources GUARDED_BY(ingest_mu);
  int64_t log_rows GUARDED_BY(db_mu) = 0;
  Stmt ins_source, ins_log, up_stream, sel_log, ups_block, dec_block, del_block, clr_block, set_ck,
      del_log;

  // Streams being cleared (ClearSource: rank nullopt). clear_mu is a leaf lock: taken under
  // ingest_mu (ApplyBatch, Clear's first step) or alone (waiting), never the other way round.
  struct ClearKey {
    uint32_t sid;
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
  MemoryIndex mem GUARDED_BY(state_mu);
  std::vector<std::string> source_names GUARDED_BY(state_mu);
  std::map<std::string, uint32_t, std::less<>> source_ids GUARDED_BY(state_mu);
  std::map<std::pair<uint32_t, int64_t>, StreamState> streams GUARDED_BY(state_mu);
  IndexerCounters counters GUARDED_BY(state_mu);
  std::atomic<int64_t> log_rows_pending{0};
  mutable std::atomic<int64_t> scores{0};
  mutable std::atomic<uint32_t> tick{1};

  Mutex bg_mu;
  CondVar bg_cv{&bg_mu};
  bool stop GUARDED_BY(bg_mu) = false;
  std::thread bg;

  ~Impl() {
    if (db) sqlite3_close_v2(db);
  }

  Status OpenDb();
  Status Load() EXCLUSIVE_LOCKS_REQUIRED(db_mu);
  Status Prepare();
  // Applies one row to memory and counts; the row's content keys are final.
  void ApplyRow(const LogRow& row, ApplyOutcome* out) EXCLUSIVE_LOCKS_REQUIRED(state_mu);
  uint32_t SourceId(std::string_view name, bool create) EXCLUSIVE_LOCKS_REQUIRED(state_mu);
  // Takes the pending rows (under ingest_mu, briefly) and commits them (under db_mu only), so
  // ingest continues while SQLite writes. On failure the rows go back in front of pending.
  Status FlushLocked() EXCLUSIVE_LOCKS_REQUIRED(db_mu) LOCKS_EXCLUDED(ingest_mu);
  // The same with ingest_mu already held (ClearSource).
  Status FlushHoldingIngest() EXCLUSIVE_LOCKS_REQUIRED(db_mu, ingest_mu);
  struct Taken {
    std::vector<LogRow> rows;
    std::vector<std::pair<uint32_t, std::string>> sources;
    std::vector<std::tuple<uint32_t, int64_t, uint64_t, double>> dirty;
  };
  Taken TakePending() EXCLUSIVE_LOCKS_REQUIRED(ingest_mu);
  void PutBack(Taken& t) EXCLUSIVE_LOCKS_REQUIRED(ingest_mu);
  Status Commit(const Taken& t) EXCLUSIVE_LOCKS_REQUIRED(db_mu);
  void MarkDurable(const Taken& t) EXCLUSIVE_LOCKS_REQUIRED(db_mu);
  Status CompactChunk(int64_t limit, int64_t* folded) EXCLUSIVE_LOCKS_REQUIRED(db_mu);
  Status FoldRow(const LogRow& row);
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
  Result<ScoreResult> ScoreLocked(const ScoreQuery& q, std::vector<uint64_t>* keys_out,
                                  bool* by_engine_out) const
      KVO_THREAD_ANNOTATION_(requires_shared_capability(state_mu));
  void BackgroundLoop();
};

// ---------------------------------------------------------------------------------------------
// Opening, validation, schema.

Status Indexer::Impl::OpenDb() {
  struct stat st {};
  const bool exists = ::stat(path.c_str(), &st) == 0;
  const bool fresh = !exists || st.st_size == 0;
  if (!exists) {
    if (opt.read_only) return Status::NotFound("index file '" + path + "' does not exist");
    if (!opt.create_if_missing) {
      return Status::NotFound("index file '" + path + "' does not exist (create_if_missing off)");
    }
    const int fd = ::open(path.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
    if (fd < 0) {
      return Status::IOError("cannot create index file '" + path + "': " + std::strerror(errno));
    }
    ::close(fd);
  } else if (!S_ISREG(st.st_mode)) {
    return Status::FailedPrecondition("index path '" + path + "' is not a regular file");
  }
  const int flags =
      (opt.read_only ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE) | SQLITE_OPEN_NOMUTEX;
  if (sqlite3_open_v2(path.c_str(), &db, flags, nullptr) != SQLITE_OK) {
    return Status::IOError("cannot open index file '" + path +
                           "': " + (db ? sqlite3_errmsg(db) : "out of memory"));
  }
  sqlite3_extended_result_codes(db, 1);
  sqlite3_busy_timeout(db, 5000);

  if (!fresh) {
    // Validate before anything can write: foreign or corrupt files are refused untouched.
    Stmt q;
    if (!q.Prepare(db, "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name").ok()) {
      return Status::Corruption("index file '" + path +
                                "' is not a SQLite database or is corrupt (" + sqlite3_errmsg(db) +
                                "); refusing to open it, the file is left untouched");
    }
    std::vector<std::string> tables;
    int rc;
    while ((rc = q.Step()) == SQLITE_ROW) tables.push_back(q.ColText(0));
    if (rc != SQLITE_DONE) {
      return Status::Corruption("index file '" + path +
                                "' is not a SQLite database or is corrupt (" + sqlite3_errmsg(db) +
                                "); refusing to open it, the file is left untouched");
    }
    Stmt a;
    KVO_RETURN_IF_ERROR(a.Prepare(db, "PRAGMA application_id"));
    const int64_t app_id = a.Step() == SQLITE_ROW ? a.ColInt(0) : 0;
    Stmt v;
    KVO_RETURN_IF_ERROR(v.Prepare(db, "PRAGMA user_version"));
    const int64_t version = v.Step() == SQLITE_ROW ? v.ColInt(0) : 0;
    // No statement may stay active across the migrations (DROP needs the schema unlocked).
    a.Reset();
    v.Reset();
    if (app_id != kApplicationId) {
      std::string names;
      for (size_t i = 0; i < tables.size() && i < 8; ++i) names += (i ? ", " : "") + tables[i];
      return Status::FailedPrecondition(
          "file '" + path + "' is a SQLite database of another application (application_id " +
          std::to_string(app_id) + ", tables: " + (names.empty() ? "none" : names) +
          "), not a kvo index; refusing to open it, the file is left untouched");
    }
    if (version > kSchemaVersion) {
      return Status::FailedPrecondition("index file '" + path + "' has schema version " +
                                        std::to_string(version) + ", newer than this kvo (" +
                                        std::to_string(kSchemaVersion) + "); refusing to open it");
    }
    if (version < 1) {
      return Status::Corruption("index file '" + path +
                                "' has the kvo application id but schema "
                                "version " +
                                std::to_string(version) + "; refusing to open it");
    }
    // Migrations from older versions, one transaction per step. A read-only open leaves the
    // file as it is (Registrations() then reports none).
    if (version == 1 && !opt.read_only) {
      KVO_RETURN_IF_ERROR(Exec(db, "BEGIN IMMEDIATE", path));
      Status s = Exec(db, kMigrateV1ToV2, path);
      if (!s.ok()) {
        (void)Exec(db, "ROLLBACK", path);
        return s;
      }
      KVO_RETURN_IF_ERROR(Exec(db, "COMMIT", path));
    }
    file_version = opt.read_only ? version : Indexer::kSchemaVersion;
    if (version <= 2 && !opt.read_only) {
      KVO_RETURN_IF_ERROR(Exec(db, "BEGIN IMMEDIATE", path));
      Status s = Exec(db, kMigrateV2ToV3, path);
      if (!s.ok()) {
        (void)Exec(db, "ROLLBACK", path);
        return s;
      }
      KVO_RETURN_IF_ERROR(Exec(db, "COMMIT", path));
    }
  }
  if (!opt.read_only) {
    KVO_RETURN_IF_ERROR(Exec(db, "PRAGMA journal_mode = WAL", path));
    KVO_RETURN_IF_ERROR(Exec(db, "PRAGMA synchronous = NORMAL", path));
  }
  // The page cache is part of the memory budget (Open resolved sqlite_cache_bytes).
  const std::string cache =
      "PRAGMA cache_size = -" + std::to_string(std::max<size_t>(1, opt.sqlite_cache_bytes / 1024));
  KVO_RETURN_IF_ERROR(Exec(db, cache.c_str(), path));
  // And a soft ceiling on everything SQLite allocates (process-wide; raised, never lowered, so
  // several indexes in one process each keep their cache): SQLite recycles cache pages rather
  // than grow past it. 2x the cache leaves room for statements, the schema and WAL indexes.
  const int64_t soft = static_cast<int64_t>(2 * opt.sqlite_cache_bytes + (size_t{16} << 20));
  const int64_t current = sqlite3_soft_heap_limit64(-1);
  if (current == 0 || current < soft) sqlite3_soft_heap_limit64(soft);
  if (fresh) {
    KVO_RETURN_IF_ERROR(Exec(db, "BEGIN IMMEDIATE", path));
    Status s = Exec(db, kSchemaSql, path);
    if (s.ok()) {
      const std::string pragmas = "PRAGMA application_id = " + std::to_string(kApplicationId) +
                                  "; PRAGMA user_version = " + std::to_string(kSchemaVersion) + ";";
      s = Exec(db, pragmas.c_str(), path);
    }
    if (!s.ok()) {
      (void)Exec(db, "ROLLBACK", path);
      return s;
    }
    KVO_RETURN_IF_ERROR(Exec(db, "COMMIT", path));
  }
  return Status::Ok();
}

Status Indexer::Impl::Prepare() {
  if (opt.read_only) return Status::Ok();
  KVO_RETURN_IF_ERROR(
      ins_source.Prepare(db, "INSERT INTO sources (source_id, name) VALUES (?, ?)"));
  KVO_RETURN_IF_ERROR(ins_log.Prepare(
      db,
      "INSERT INTO event_log (source_id, dp_rank, seq, ts, seen_at, kind, medium, group_idx, "
      "block_size, lora_name, parent_hash, hashes, content_keys, token_width, token_ids, "
      "ownership) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"));
  KVO_RETURN_IF_ERROR(up_stream.Prepare(
      db,
      "INSERT INTO streams (source_id, dp_rank, last_seq, last_event_ts, updated_at) "
      "VALUES (?, ?, ?, ?, ?) ON CONFLICT (source_id, dp_rank) DO UPDATE SET "
      "last_seq = excluded.last_seq, last_event_ts = excluded.last_event_ts, "
      "updated_at = excluded.updated_at"));
  KVO_RETURN_IF_ERROR(sel_log.Prepare(
      db,
      "SELECT id, source_id, dp_rank, seq, ts, seen_at, kind, medium, group_idx, block_size, "
      "lora_name, parent_hash, hashes, content_keys, token_width, token_ids, ownership FROM "
      "event_log "
      "ORDER BY id LIMIT ?"));
  KVO_RETURN_IF_ERROR(ups_block.Prepare(
      db,
      "INSERT INTO blocks (source_id, dp_rank, medium, group_idx, engine_hash, refcount, "
      "parent_hash, content_key, block_size, token_count, token_width, token_ids, lora_name, "
      "first_seq, last_seq, first_seen, last_seen, ownership) "
      "VALUES (?, ?, ?, ?, ?, 1, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
      "ON CONFLICT (source_id, dp_rank, medium, ownership, group_idx, engine_hash) DO UPDATE SET "
      "refcount = refcount + 1, last_seq = excluded.last_seq, last_seen = excluded.last_seen, "
      "content_key = coalesce(blocks.content_key, excluded.content_key), "
      "token_width = CASE WHEN blocks.token_ids IS NULL THEN excluded.token_width "
      "ELSE blocks.token_width END, "
      "token_count = CASE WHEN blocks.token_ids IS NULL THEN excluded.token_count "
      "ELSE blocks.token_count END, "
      "token_ids = coalesce(blocks.token_ids, excluded.token_ids), "
      "block_size = CASE WHEN blocks.block_size = 0 THEN excluded.block_size "
      "ELSE blocks.block_size END"));
  KVO_RETURN_IF_ERROR(dec_block.Prepare(
      db,
      "UPDATE blocks SET refcount = refcount - 1 WHERE source_id = ? AND dp_rank = ? AND "
      "medium = ? AND group_idx = ? AND engine_hash = ? AND ownership = ?"));
  KVO_RETURN_IF_ERROR(del_block.Prepare(
      db,
      "DELETE FROM blocks WHERE source_id = ? AND dp_rank = ? AND medium = ? AND group_idx = ? "
      "AND engine_hash = ? AND ownership = ? AND refcount <= 0"));
  KVO_RETURN_IF_ERROR(clr_block.Prepare(
      db,
      "DELETE FROM blocks WHERE source_id = ? AND dp_rank = ? AND medium = ? AND ownership = ''"));
  KVO_RETURN_IF_ERROR(set_ck.Prepare(
      db, "UPDATE blocks SET content_key = ? WHERE engine_hash = ? AND content_key IS NULL"));
  KVO_RETURN_IF_ERROR(del_log.Prepare(db, "DELETE FROM event_log WHERE id <= ?"));
  return Status::Ok();
}

uint32_t Indexer::Impl::SourceId(std::string_view name, bool create) {
  auto it = source_ids.find(name);
  if (it != source_ids.end()) return it->second;
  if (!create) return UINT32_MAX;
  const uint32_t id = static_cast<uint32_t>(source_names.size()) + 1;  // ids start at 1
  source_names.emplace_back(name);
  source_ids.emplace(std::string(name), id);
  return id;
}

namespace {
LogRow ReadLogRow(Stmt& st, int64_t* id) {
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
}  // namespace

Status Indexer::Impl::Load() {
  // A read-only open of a file whose clear was interrupted leaves the cleared streams out.
  KVO_ASSIGN_OR_RETURN(const auto markers, ReadClearMarkers());
  auto cleared = [&markers](uint32_t sid, int64_t rank) {
    for (const auto& m : markers) {
      if (m.first.Covers(sid, rank)) return true;
    }
    return false;
  };
  WriterLock l(&state_mu);
  auto corrupt = [&](const char* what) {
    return Status::Corruption("index file '" + path + "': reading " + what + " failed (" +
                              sqlite3_errmsg(db) + "); refusing to open it");
  };
  {
    Stmt q;
    KVO_RETURN_IF_ERROR(q.Prepare(db, "SELECT source_id, name FROM sources ORDER BY source_id"));
    int rc;
    while ((rc = q.Step()) == SQLITE_ROW) {
      const int64_t id = q.ColInt(0);
      if (id < 1 || id > 1'000'000)
        return Status::Corruption("index '" + path + "': bad source id");
      if (source_names.size() < static_cast<size_t>(id)) source_names.resize(id);
      source_names[id - 1] = q.ColText(1);
      source_ids[q.ColText(1)] = static_cast<uint32_t>(id);
    }
    if (rc != SQLITE_DONE) return corrupt("sources");
  }
  {
    Stmt q;
    KVO_RETURN_IF_ERROR(
        q.Prepare(db, "SELECT source_id, dp_rank, last_seq, last_event_ts FROM streams"));
    int rc;
    while ((rc = q.Step()) == SQLITE_ROW) {
      if (cleared(static_cast<uint32_t>(q.ColInt(0)), q.ColInt(1))) continue;
      StreamState s;
      s.last_seq = static_cast<uint64_t>(q.ColInt(2));
      s.durable_seq = s.last_seq;
      s.last_ts = q.ColReal(3);
      streams[{static_cast<uint32_t>(q.ColInt(0)), q.ColInt(1)}] = s;
    }
    if (rc != SQLITE_DONE) return corrupt("streams");
  }
  {
    Stmt q;
    // A version-2 file opened read-only has no ownership column: its rows are all ''.
    const std::string own = file_version >= 3 ? "ownership" : "''";
    KVO_RETURN_IF_ERROR(q.Prepare(db, ("SELECT source_id, dp_rank, medium, group_idx, engine_hash, "
                                       "refcount, content_key, block_size, first_seq, " +
                                       own + " FROM blocks")
                                          .c_str()));
    int rc;
    while ((rc = q.Step()) == SQLITE_ROW) {
      if (cleared(static_cast<uint32_t>(q.ColInt(0)), q.ColInt(1))) continue;
      const uint32_t inst = mem.InstanceId(static_cast<uint32_t>(q.ColInt(0)), q.ColInt(1));
      const uint32_t medium = mem.MediumId(ResidencyKey(q.ColText(2), q.ColText(9)));
      const uint32_t group = mem.GroupId(q.ColInt(3));
      if (inst == UINT32_MAX || medium == UINT32_MAX || group == UINT32_MAX) {
        return Status::OutOfRange("index '" + path + "': too many instances, media or groups");
      }
      bool conflict = false;
      const int64_t ref = q.ColInt(5);
      if (ref <= 0) continue;
      (void)mem.Store(inst, medium, group, static_cast<uint64_t>(q.ColInt(4)),
                      q.ColNull(6) ? 0 : static_cast<uint64_t>(q.ColInt(6)), q.ColInt(7),
                      static_cast<uint64_t>(q.ColInt(8)), static_cast<uint32_t>(ref), &conflict);
    }
    if (rc != SQLITE_DONE) return corrupt("blocks");
  }
  {
    Stmt q;
    const std::string own = file_version >= 3 ? "ownership" : "''";
    KVO_RETURN_IF_ERROR(q.Prepare(
        db, ("SELECT id, source_id, dp_rank, seq, ts, seen_at, kind, medium, group_idx, "
             "block_size, lora_name, parent_hash, hashes, content_keys, token_width, token_ids, " +
             own + " FROM event_log ORDER BY id")
                .c_str()));
    int rc;
    int64_t rows = 0;
    while ((rc = q.Step()) == SQLITE_ROW) {
      int64_t id;
      LogRow r = ReadLogRow(q, &id);
      ++rows;
      if (cleared(r.source_id, r.dp_rank)) continue;
      ApplyOutcome ignored;
      ApplyRow(r, &ignored);
    }
    if (rc != SQLITE_DONE) return corrupt("event_log");
    log_rows = rows;
    log_rows_pending = rows;
  }
  const int64_t dropped = counters.dropped_by_budget;
  counters = IndexerCounters{};
  EvictIfNeeded();
  counters.dropped_by_budget += dropped;
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// Applying events.

void Indexer::Impl::ApplyRow(const LogRow& row, ApplyOutcome* out) {
  const uint32_t inst = mem.InstanceId(row.source_id, row.dp_rank);
  const uint32_t medium = mem.MediumId(ResidencyKey(row.medium, row.ownership));
  const uint32_t group = mem.GroupId(row.group);
  if (inst == UINT32_MAX || medium == UINT32_MAX || group == UINT32_MAX) return;  // checked before
  ++counters.events;
  mem.set_store_tick(tick.load(std::memory_order_relaxed));
  switch (row.kind) {
    case kStore:
      for (size_t i = 0; i < row.hashes.size(); ++i) {
        bool conflict = false;
        const bool dup = mem.Store(inst, medium, group, row.hashes[i], row.content_keys[i],
                                   row.block_size, row.seq, 1, &conflict);
        ++counters.stores;
        counters.duplicate_stores += dup ? 1 : 0;
        counters.content_mismatches += conflict ? 1 : 0;
      }
      counters.block_events += static_cast<int64_t>(row.hashes.size());
      out->block_events += static_cast<int64_t>(row.hashes.size());
      break;
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
      mem.ClearWhere([inst](uint32_t i) { return i == inst; }, medium);
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

Indexer::Indexer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Indexer::~Indexer() {
  if (impl_->bg.joinable()) {
    {
      MutexLock l(&impl_->bg_mu);
      impl_->stop = true;
    }
    impl_->bg_cv.SignalAll();
    impl_->bg.join();
  }
  if (!impl_->opt.read_only && impl_->db) {
    MutexLock l(&impl_->db_mu);
    const Status s = impl_->FlushLocked();
    if (!s.ok())
      KVO_LOG_ERROR("indexer: final flush of '{}' failed: {}", impl_->path, s.ToString());
  }
}

Result<std::unique_ptr<Indexer>> Indexer::Open(const std::string& path,
                                               const IndexerOptions& options) {
  if (path.empty()) return Status::InvalidArgument("index path is empty");
  if (options.flush_max_events == 0 || options.compact_chunk_rows <= 0 ||
      options.default_block_size <= 0) {
    return Status::InvalidArgument(
        "indexer options: flush_max_events, compact_chunk_rows and default_block_size must be "
        "positive");
  }
  IndexerOptions opt = options;
  if (opt.sqlite_cache_bytes == 0) {
    opt.sqlite_cache_bytes = std::min<size_t>(size_t{64} << 20, opt.memory_budget_bytes / 8);
  }
  if (opt.sqlite_cache_bytes >= opt.memory_budget_bytes) {
    return Status::InvalidArgument(
        "indexer options: sqlite_cache_bytes (" + std::to_string(opt.sqlite_cache_bytes) +
        ") must be below memory_budget_bytes (" + std::to_string(opt.memory_budget_bytes) + ")");
  }
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->opt = opt;
  impl->clock = options.clock ? options.clock : SystemClock();
  KVO_RETURN_IF_ERROR(impl->OpenDb());
  KVO_RETURN_IF_ERROR(impl->Prepare());
  if (!options.read_only) KVO_RETURN_IF_ERROR(impl->ResumeClears());
  {
    MutexLock l(&impl->db_mu);
    KVO_RETURN_IF_ERROR(impl->Load());
    impl->UpdateSqliteBytes();
  }
  std::unique_ptr<Indexer> idx(new Indexer(std::move(impl)));
  if (options.background_thread && !options.read_only) {
    Impl* p = idx->impl_.get();
    p->bg = std::thread([p] { p->BackgroundLoop(); });
  }
  return idx;
}

void Indexer::Impl::BackgroundLoop() {
  const auto interval = std::chrono::milliseconds(std::max<int64_t>(1, opt.flush_interval_ms));
  for (;;) {
    {
      MutexLock l(&bg_mu);
      if (stop) return;
      bg_cv.WaitFor(interval);
      if (stop) return;
    }
    MutexLock l(&db_mu);
    Status s = FlushLocked();
    if (s.ok() && log_rows >= opt.compact_min_log_rows) {
      int64_t folded = 0;
      s = CompactChunk(opt.compact_chunk_rows, &folded);
    }
    if (!s.ok()) KVO_LOG_ERROR("indexer '{}': background flush/compaction: {}", path, s.ToString());
  }
}

Result<ApplyOutcome> Indexer::ApplyBatch(std::string_view source, int64_t dp_rank, uint64_t seq,
                                         const EventBatch& batch) {
  Impl& d = *impl_;
  if (d.opt.read_only) return Status::FailedPrecondition("index '" + d.path + "' is read-only");
  if (source.empty()) return Status::InvalidArgument("ApplyBatch: source name is empty");
  if (dp_rank < 0) {
    return Status::InvalidArgument("ApplyBatch: dp_rank " + std::to_string(dp_rank) +
                                   " of source '" + std::string(source) + "' is negative");
  }
  if (seq > (uint64_t{1} << 62)) {
    return Status::InvalidArgument("ApplyBatch: sequence " + std::to_string(seq) + " of source '" +
                                   std::string(source) + "' is out of range");
  }
  ApplyOutcome out;
  bool must_flush = false;
  bool busy = false;  // the stream is being cleared: wait for the clear, then apply
  auto attempt = [&]() -> Status {
    MutexLock ingest(&d.ingest_mu);
    const double now = d.clock->NowSeconds();
    std::vector<LogRow> rows;
    {
      WriterLock l(&d.state_mu);
      // Validate the whole batch before any state changes: a refused batch registers no source,
      // stream, medium or group (issue 10 item 11).
      const auto src_it = d.source_ids.find(source);
      const bool known_source = src_it != d.source_ids.end();
      uint32_t sid = known_source ? src_it->second : 0;
      if (known_source) {
        auto sit = d.streams.find({sid, dp_rank});
        if (d.ClearingCovers(sid, dp_rank)) {
          busy = true;
          return Status::Ok();
        }
        if (sit != d.streams.end() && seq <= sit->second.last_seq) {
          ++d.counters.batches_duplicate;
          return Status::Ok();
        }
      }
      if ((!known_source || d.mem.FindInstance(sid, dp_rank) == UINT32_MAX) &&
          d.mem.instance_count() >= indexer_internal::kMaxInstances) {
        return Status::OutOfRange("too many (source, dp_rank) streams in index '" + d.path + "'");
      }
      std::set<std::string> new_media;
      std::set<int64_t> new_groups;
      // Convert every event first (validating), then apply them in order.
      rows.reserve(batch.events.size());
      for (const KvEvent& ev : batch.events) {
        LogRow r;
        r.source_id = sid;
        r.dp_rank = dp_rank;
        r.seq = seq;
        r.ts = batch.ts;
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
        const std::string key = ResidencyKey(r.medium, r.ownership);
        if (key.size() > indexer_internal::kMaxMediumNameBytes) {
          return Status::InvalidArgument("source '" + std::string(source) + "': a medium name" +
                                         (r.ownership.empty() ? "" : " and ownership") + " of " +
                                         std::to_string(key.size()) + " bytes (at most " +
                                         std::to_string(indexer_internal::kMaxMediumNameBytes) +
                                         "); batch refused");
        }
        if (r.medium.find(kOwnerSep) != std::string::npos ||
            r.ownership.find(kOwnerSep) != std::string::npos) {
          return Status::InvalidArgument("source '" + std::string(source) +
                                         "': a medium or ownership name holds a control "
                                         "character (0x1f); batch refused");
        }
        if (d.mem.FindMedium(key) == UINT32_MAX) new_media.insert(key);
        if (d.mem.FindGroup(r.group) == UINT32_MAX) new_groups.insert(r.group);
        if (d.mem.medium_count() + new_media.size() > indexer_internal::kMaxMedia ||
            d.mem.group_count() + new_groups.size() > indexer_internal::kMaxGroups) {
          return Status::OutOfRange("source '" + std::string(source) + "': batch " +
                                    std::to_string(seq) + " would exceed the index's " +
                                    std::to_string(indexer_internal::kMaxMedia) + " media or " +
                                    std::to_string(indexer_internal::kMaxGroups) +
                                    " KV-cache groups (medium '" + r.medium + "', group " +
                                    std::to_string(r.group) + "); batch refused, nothing applied");
        }
        rows.push_back(std::move(r));
      }
      // Valid: register what the batch names (cannot fail now).
      if (!known_source) {
        sid = d.SourceId(source, true);
        d.new_sources.emplace_back(sid, std::string(source));
      }
      if (d.mem.InstanceId(sid, dp_rank) == UINT32_MAX) {
        return Status::Internal("instance registry refused a validated stream");
      }
      for (LogRow& r : rows) {
        r.source_id = sid;
        if (d.mem.MediumId(ResidencyKey(r.medium, r.ownership)) == UINT32_MAX ||
            d.mem.GroupId(r.group) == UINT32_MAX) {
          return Status::Internal("medium/group registry refused a validated batch");
        }
      }
      for (LogRow& r : rows) {
        if (r.kind == kStore) {
          const size_t n = r.hashes.size();
          r.content_keys.assign(n, 0);
          if (r.token_ids.empty()) {
            for (size_t i = 0; i < n; ++i) {
              const uint32_t node = d.mem.NodeByEngine(r.hashes[i]);
              r.content_keys[i] = node == kNoNode ? 0 : d.mem.NodeContentKey(node);
              if (r.content_keys[i] != 0) {
                ++d.counters.placeholders_resolved;
              } else {
                ++d.counters.placeholders_unresolved;
              }
            }
          } else if (r.block_size > 0 &&
                     r.token_ids.size() == n * static_cast<size_t>(r.block_size)) {
            uint64_t parent_key = 0;
            if (!r.parent) {
              parent_key = ContentKeyRoot(r.lora_name.value_or(""));
            } else {
              const uint32_t node = d.mem.NodeByEngine(*r.parent);
              parent_key = node == kNoNode ? 0 : d.mem.NodeContentKey(node);
            }
            if (parent_key == 0) {
              ++d.counters.unresolved_parents;
            } else {
              const size_t bs = static_cast<size_t>(r.block_size);
              for (size_t i = 0; i < n; ++i) {
                parent_key = ContentKey(parent_key,
                                        std::span<const int64_t>(r.token_ids).subspan(i * bs, bs));
                r.content_keys[i] = parent_key;
              }
            }
          } else {
            ++d.counters.content_mismatches;
          }
          // A block whose own content could not be keyed (unresolved parent, token mismatch)
          // still gets the key its node already has, so the log (and a rebuild from it) holds
          // what memory holds.
          for (size_t i = 0; i < n; ++i) {
            if (r.content_keys[i] != 0) continue;
            const uint32_t node = d.mem.NodeByEngine(r.hashes[i]);
            if (node != kNoNode) r.content_keys[i] = d.mem.NodeContentKey(node);
          }
        }
        d.ApplyRow(r, &out);
      }
      StreamState& s = d.streams[{sid, dp_rank}];
      s.last_seq = seq;
      s.last_ts = batch.ts;
      s.dirty = true;
      ++d.counters.batches_applied;
      out.applied = true;
      d.tick.fetch_add(1, std::memory_order_relaxed);
      d.EvictIfNeeded();
    }
    if (d.pending.empty()) d.pending_since_ns = d.clock->MonotonicNanos();
    for (LogRow& r : rows) d.pending.push_back(std::move(r));
    const bool due =
        d.pending.size() >= d.opt.flush_max_events ||
        d.clock->MonotonicNanos() - d.pending_since_ns >= d.opt.flush_interval_ms * 1'000'000;
    if (d.bg.joinable()) {
      // The background thread commits; the caller commits itself only as back-pressure.
      if (due) d.bg_cv.Signal();
      must_flush = d.pending.size() >= 4 * d.opt.flush_max_events;
    } else {
      must_flush = due;
    }
    return Status::Ok();
  };
  for (;;) {
    KVO_RETURN_IF_ERROR(attempt());
    if (!busy) break;
    busy = false;
    d.WaitUntilNotClearing(source, dp_rank);
  }
  if (must_flush) {
    MutexLock db(&d.db_mu);
    KVO_RETURN_IF_ERROR(d.FlushLocked());
  }
  return out;
}

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
  const Status s = Commit(t);
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
  const Status s = Commit(t);
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
    const Status s = Status::IOError("index '" + path + "': " + what + ": " + sqlite3_errmsg(db));
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
  if (const Status s = Exec(db, "COMMIT", path); !s.ok()) {
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
    const bool sliced =
        r.block_size > 0 && !r.token_ids.empty() && r.token_ids.size() == n * r.block_size;
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

Status Indexer::PutRegistration(std::string_view name, std::string_view body) {
  Impl& d = *impl_;
  if (d.opt.read_only) return Status::FailedPrecondition("index '" + d.path + "' is read-only");
  MutexLock l(&d.db_mu);
  Stmt st;
  KVO_RETURN_IF_ERROR(st.Prepare(
      d.db, "INSERT OR REPLACE INTO registrations (name, body, created_at) VALUES (?, ?, ?)"));
  st.Text(1, name);
  st.Text(2, body);
  st.Real(3, d.clock->NowSeconds());
  return StepDone(d.db, st, d.path, "store a registration");
}

Status Indexer::DeleteRegistration(std::string_view name) {
  Impl& d = *impl_;
  if (d.opt.read_only) return Status::FailedPrecondition("index '" + d.path + "' is read-only");
  MutexLock l(&d.db_mu);
  Stmt st;
  KVO_RETURN_IF_ERROR(st.Prepare(d.db, "DELETE FROM registrations WHERE name = ?"));
  st.Text(1, name);
  return StepDone(d.db, st, d.path, "delete a registration");
}

Result<std::vector<StoredRegistration>> Indexer::Registrations() const {
  Impl& d = *impl_;
  MutexLock l(&d.db_mu);
  std::vector<StoredRegistration> out;
  Stmt st;
  if (!st.Prepare(d.db, "SELECT name, body FROM registrations ORDER BY name").ok()) {
    if (d.opt.read_only) return out;  // a version-1 file opened read-only: none
    return Status::Internal("index '" + d.path +
                            "': cannot read registrations: " + sqlite3_errmsg(d.db));
  }
  int rc;
  while ((rc = st.Step()) == SQLITE_ROW) out.push_back({st.ColText(0), st.ColText(1)});
  if (rc != SQLITE_DONE) {
    return Status::IOError("index '" + d.path +
                           "': reading registrations: " + sqlite3_errmsg(d.db));
  }
  return out;
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

void Indexer::Impl::UpdateSqliteBytes() {
  Stmt q;
  if (q.Prepare(db, "SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()")
          .ok() &&
      q.Step() == SQLITE_ROW) {
    sqlite_bytes = q.ColInt(0);
  }
}

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
  const Status sql = ClearSql(key, fold_upto);
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

Result<std::vector<Indexer::TieredMatch>> Indexer::Tiered(const ScoreQuery& query) const {
  const Impl& d = *impl_;
  ReaderLock l(&d.state_mu);
  bool by_engine = false;
  int64_t block_size = 0;
  KVO_ASSIGN_OR_RETURN(indexer_internal::BlockKeys keys,
                       d.QueryKeys(query, &by_engine, &block_size));
  const size_t W = d.mem.words();
  std::vector<uint64_t> filter(W, 0);
  for (uint32_t inst = 0; inst < d.mem.instance_count(); ++inst) {
    bool wanted = query.sources.empty();
    for (const std::string& name : query.sources) {
      auto it = d.source_ids.find(name);
      wanted = wanted || (it != d.source_ids.end() && d.mem.InstanceSource(inst) == it->second);
    }
    if (wanted) filter[inst / 64] |= uint64_t{1} << (inst % 64);
  }
  std::vector<uint8_t> tiers(d.mem.medium_count(), 3);
  for (size_t m = 0; m < tiers.size(); ++m) {
    const std::string name = MediumOfKey(d.mem.MediumName(static_cast<uint32_t>(m)));
    if (name == "GPU") {
      tiers[m] = 0;
    } else if (name == "CPU") {
      tiers[m] = 1;
    } else if (name == "STORAGE" || name == "DISK") {
      tiers[m] = 2;
    }
  }
  auto bounds = d.mem.TieredScore(keys, by_engine, filter, tiers);
  d.scores.fetch_add(1, std::memory_order_relaxed);
  std::vector<TieredMatch> out;
  for (uint32_t inst = 0; inst < bounds.size(); ++inst) {
    if ((filter[inst / 64] >> (inst % 64) & 1) == 0 || d.mem.InstanceHidden(inst)) continue;
    const uint32_t sid = d.mem.InstanceSource(inst);
    const int64_t rank = d.mem.InstanceRank(inst);
    if (bounds[inst][2] == 0 && d.streams.find({sid, rank}) == d.streams.end()) continue;
    out.push_back(
        {d.source_names[sid - 1], rank, bounds[inst][0], bounds[inst][1], bounds[inst][2]});
  }
  return out;
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
    st.blocks_in_memory = static_cast<int64_t>(d.mem.node_count());
    st.entries_in_memory = static_cast<int64_t>(d.mem.entry_count());
    st.memory_bytes = d.mem.AllocatedBytes();
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
