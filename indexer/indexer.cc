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
#include <cmath>
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
    // Migrations from older versions would run here, one transaction per step (none yet: v1).
  }
  if (!opt.read_only) {
    KVO_RETURN_IF_ERROR(Exec(db, "PRAGMA journal_mode = WAL", path));
    KVO_RETURN_IF_ERROR(Exec(db, "PRAGMA synchronous = NORMAL", path));
  }
  KVO_RETURN_IF_ERROR(Exec(db, "PRAGMA cache_size = -65536", path));
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
      "block_size, lora_name, parent_hash, hashes, content_keys, token_width, token_ids) "
      "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"));
  KVO_RETURN_IF_ERROR(up_stream.Prepare(
      db,
      "INSERT INTO streams (source_id, dp_rank, last_seq, last_event_ts, updated_at) "
      "VALUES (?, ?, ?, ?, ?) ON CONFLICT (source_id, dp_rank) DO UPDATE SET "
      "last_seq = excluded.last_seq, last_event_ts = excluded.last_event_ts, "
      "updated_at = excluded.updated_at"));
  KVO_RETURN_IF_ERROR(sel_log.Prepare(
      db,
      "SELECT id, source_id, dp_rank, seq, ts, seen_at, kind, medium, group_idx, block_size, "
      "lora_name, parent_hash, hashes, content_keys, token_width, token_ids FROM event_log "
      "ORDER BY id LIMIT ?"));
  KVO_RETURN_IF_ERROR(ups_block.Prepare(
      db,
      "INSERT INTO blocks (source_id, dp_rank, medium, group_idx, engine_hash, refcount, "
      "parent_hash, content_key, block_size, token_count, token_width, token_ids, lora_name, "
      "first_seq, last_seq, first_seen, last_seen) "
      "VALUES (?, ?, ?, ?, ?, 1, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
      "ON CONFLICT (source_id, dp_rank, medium, group_idx, engine_hash) DO UPDATE SET "
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
      "medium = ? AND group_idx = ? AND engine_hash = ?"));
  KVO_RETURN_IF_ERROR(del_block.Prepare(
      db,
      "DELETE FROM blocks WHERE source_id = ? AND dp_rank = ? AND medium = ? AND group_idx = ? "
      "AND engine_hash = ? AND refcount <= 0"));
  KVO_RETURN_IF_ERROR(clr_block.Prepare(
      db, "DELETE FROM blocks WHERE source_id = ? AND dp_rank = ? AND medium = ?"));
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
  if (r.kind == kStore) r.content_keys.resize(r.hashes.size(), 0);
  return r;
}
}  // namespace

Status Indexer::Impl::Load() {
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
    KVO_RETURN_IF_ERROR(q.Prepare(db,
                                  "SELECT source_id, dp_rank, medium, group_idx, engine_hash, "
                                  "refcount, content_key, block_size, first_seq FROM blocks"));
    int rc;
    while ((rc = q.Step()) == SQLITE_ROW) {
      const uint32_t inst = mem.InstanceId(static_cast<uint32_t>(q.ColInt(0)), q.ColInt(1));
      const uint32_t medium = mem.MediumId(q.ColText(2));
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
    KVO_RETURN_IF_ERROR(q.Prepare(
        db,
        "SELECT id, source_id, dp_rank, seq, ts, seen_at, kind, medium, group_idx, block_size, "
        "lora_name, parent_hash, hashes, content_keys, token_width, token_ids FROM event_log "
        "ORDER BY id"));
    int rc;
    int64_t rows = 0;
    while ((rc = q.Step()) == SQLITE_ROW) {
      int64_t id;
      LogRow r = ReadLogRow(q, &id);
      ApplyOutcome ignored;
      ApplyRow(r, &ignored);
      ++rows;
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
  const uint32_t medium = mem.MediumId(row.medium);
  const uint32_t group = mem.GroupId(row.group);
  if (inst == UINT32_MAX || medium == UINT32_MAX || group == UINT32_MAX) return;  // checked before
  ++counters.events;
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
  if (mem.BudgetBytes() <= opt.memory_budget_bytes) return;
  counters.dropped_by_budget += mem.EvictTo(opt.memory_budget_bytes / 10 * 9);
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
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->opt = options;
  impl->clock = options.clock ? options.clock : SystemClock();
  KVO_RETURN_IF_ERROR(impl->OpenDb());
  KVO_RETURN_IF_ERROR(impl->Prepare());
  {
    MutexLock l(&impl->db_mu);
    KVO_RETURN_IF_ERROR(impl->Load());
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
  {
    MutexLock ingest(&d.ingest_mu);
    const double now = d.clock->NowSeconds();
    std::vector<LogRow> rows;
    {
      WriterLock l(&d.state_mu);
      const bool known_source = d.source_ids.count(source) > 0;
      const uint32_t sid = d.SourceId(source, true);
      if (!known_source) d.new_sources.emplace_back(sid, std::string(source));
      auto sit = d.streams.find({sid, dp_rank});
      if (sit != d.streams.end() && seq <= sit->second.last_seq) {
        ++d.counters.batches_duplicate;
        return out;
      }
      const uint32_t inst = d.mem.InstanceId(sid, dp_rank);
      if (inst == UINT32_MAX) {
        return Status::OutOfRange("too many (source, dp_rank) streams in index '" + d.path + "'");
      }
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
          r.group = rm->group_idx.value_or(0);
          r.hashes.reserve(rm->block_hashes.size());
          for (const BlockHash& h : rm->block_hashes) r.hashes.push_back(h.Low64());
        } else {
          r.kind = kClearAll;
          r.medium = kMediumGpu;
        }
        if (d.mem.MediumId(r.medium) == UINT32_MAX || d.mem.GroupId(r.group) == UINT32_MAX) {
          return Status::OutOfRange("source '" + std::string(source) +
                                    "': too many distinct media or KV-cache groups (medium '" +
                                    r.medium + "', group " + std::to_string(r.group) + ")");
        }
        rows.push_back(std::move(r));
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

Status Indexer::ClearSource(std::string_view source) { return impl_->Clear(source, std::nullopt); }

Status Indexer::ClearStream(std::string_view source, int64_t dp_rank) {
  return impl_->Clear(source, dp_rank);
}

Status Indexer::Impl::Clear(std::string_view source, std::optional<int64_t> rank) {
  Impl& d = *this;
  if (d.opt.read_only) return Status::FailedPrecondition("index '" + d.path + "' is read-only");
  MutexLock db_lock(&d.db_mu);
  MutexLock ingest_lock(&d.ingest_mu);
  uint32_t sid;
  {
    ReaderLock l(&d.state_mu);
    auto it = d.source_ids.find(source);
    if (it == d.source_ids.end()) return Status::Ok();
    sid = it->second;
  }
  KVO_RETURN_IF_ERROR(d.FlushHoldingIngest());
  // Fold the whole log first: a content key this stream's stores gave to blocks that other
  // streams hold reaches their rows (the keyless back-fill) before this stream's rows go.
  while (d.log_rows > 0) {
    int64_t folded = 0;
    KVO_RETURN_IF_ERROR(d.CompactChunk(d.opt.compact_chunk_rows, &folded));
    if (folded == 0) break;
  }
  KVO_RETURN_IF_ERROR(Exec(d.db, "BEGIN IMMEDIATE", d.path));
  Status s;
  int64_t log_deleted = 0;
  for (const char* table : {"blocks", "event_log", "streams"}) {
    const std::string sql = std::string("DELETE FROM ") + table + " WHERE source_id = ?" +
                            (rank.has_value() ? " AND dp_rank = ?" : "");
    Stmt st;
    s = st.Prepare(d.db, sql.c_str());
    if (!s.ok()) break;
    st.Int(1, sid);
    if (rank.has_value()) st.Int(2, *rank);
    s = StepDone(d.db, st, d.path, "clearing a source");
    if (!s.ok()) break;
    if (std::strcmp(table, "event_log") == 0) log_deleted = sqlite3_changes(d.db);
  }
  if (s.ok()) s = Exec(d.db, "COMMIT", d.path);
  if (!s.ok()) {
    (void)Exec(d.db, "ROLLBACK", d.path);
    return s;
  }
  d.log_rows -= log_deleted;
  d.log_rows_pending = d.log_rows;
  WriterLock l(&d.state_mu);
  // The callback runs under this lock; pointers keep the analysis from asking for it again.
  const MemoryIndex* index = &d.mem;
  d.mem.ClearWhere(
      [index, sid, rank](uint32_t inst) {
        return index->InstanceSource(inst) == sid &&
               (!rank.has_value() || index->InstanceRank(inst) == *rank);
      },
      UINT32_MAX);
  for (auto it = d.streams.begin(); it != d.streams.end();) {
    const bool match = it->first.first == sid && (!rank.has_value() || it->first.second == *rank);
    it = match ? d.streams.erase(it) : std::next(it);
  }
  ++d.counters.source_clears;
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
    const std::string& name = mem.MediumName(static_cast<uint32_t>(m));
    auto it = q.weights.find(name);
    weights[m] = it != q.weights.end() ? it->second : DefaultWeight(name);
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
        s.blocks_per_medium[mem.MediumName(static_cast<uint32_t>(m))] = c.present[m];
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
        x.medium = d.mem.MediumName(h.medium);
        x.group = d.mem.GroupValue(h.group);
        x.refcount = h.refcount;
        x.since_seq = h.since_seq;
        b.holders.push_back(std::move(x));
      }
      std::sort(b.holders.begin(), b.holders.end(),
                [](const ExplainHolder& a, const ExplainHolder& c) {
                  return std::tie(a.source, a.dp_rank, a.medium, a.group) <
                         std::tie(c.source, c.dp_rank, c.medium, c.group);
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
      for (uint32_t m = 0; m < per[inst].size(); ++m) {
        if (per[inst][m] == 0) continue;
        MediumStats ms;
        ms.source = d.source_names[d.mem.InstanceSource(inst) - 1];
        ms.dp_rank = d.mem.InstanceRank(inst);
        ms.medium = d.mem.MediumName(m);
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
  st.log_rows_pending = d.log_rows_pending.load();
  st.schema_version = kSchemaVersion;
  std::sort(
      st.per_medium.begin(), st.per_medium.end(), [](const MediumStats& a, const MediumStats& b) {
        return std::tie(a.source, a.dp_rank, a.medium) < std::tie(b.source, b.dp_rank, b.medium);
      });
  std::sort(st.streams.begin(), st.streams.end(), [](const StreamStats& a, const StreamStats& b) {
    return std::tie(a.source, a.dp_rank) < std::tie(b.source, b.dp_rank);
  });
  {
    // page_count * page_size; the connection is used under db_mu only.
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
    DumpEntry e;
    e.source = (*names)[mem->InstanceSource(inst) - 1];
    e.dp_rank = mem->InstanceRank(inst);
    e.medium = mem->MediumName(medium);
    e.group = mem->GroupValue(group);
    e.engine_hash = mem->NodeEngineHash(node);
    e.content_key = mem->NodeContentKey(node);
    e.block_size = mem->NodeBlockSize(node);
    e.refcount = ref;
    e.since_seq = since;
    all.push_back(std::move(e));
  });
  std::sort(all.begin(), all.end(), [](const DumpEntry& a, const DumpEntry& b) {
    return std::tie(a.source, a.dp_rank, a.medium, a.group, a.engine_hash) <
           std::tie(b.source, b.dp_rank, b.medium, b.group, b.engine_hash);
  });
  for (const DumpEntry& e : all) {
    if (!fn(e)) break;
  }
}

const std::string& Indexer::path() const { return impl_->path; }

}  // namespace kvo
