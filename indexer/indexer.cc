// Indexer, the store: SQLite durability (append-only log + compacted `blocks`) around
// MemoryIndex: schema, open/migrate, load, the background committer, registrations. commit.cc
// commits and compacts, ingest.cc applies batches and clears, query.cc answers. See
// indexer/DESIGN.md for the state, the locking rule and the invariants.
#include "indexer/indexer.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>

#include "common/logging.h"
#include "indexer/indexer_internal.h"

namespace kvo {

using indexer_internal::Exec;
using indexer_internal::kNoNode;
using indexer_internal::LogRow;
using indexer_internal::ReadLogRow;
using indexer_internal::ResidencyKey;
using indexer_internal::StepDone;
using indexer_internal::Stmt;
using indexer_internal::StreamState;

namespace {

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

}  // namespace

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
                                       own + ", parent_hash FROM blocks")
                                          .c_str()));
    // The walk's chain hints (DESIGN.md "Chain hints"): each loaded block's parent is linked to it
    // once every block is in, so the first walk after a restart follows the chain as a walk after
    // ingest does. A parent with several children hints at the last one read.
    std::vector<std::pair<uint64_t, uint32_t>> parent_of;
    int rc;
    int64_t loaded = 0;
    while ((rc = q.Step()) == SQLITE_ROW) {
      if (cleared(static_cast<uint32_t>(q.ColInt(0)), q.ColInt(1))) continue;
      LoadStep(++loaded);
      const uint32_t inst = mem.InstanceId(static_cast<uint32_t>(q.ColInt(0)), q.ColInt(1));
      const uint32_t medium = mem.MediumId(ResidencyKey(q.ColText(2), q.ColText(9)));
      const uint32_t group = mem.GroupId(q.ColInt(3));
      if (inst == UINT32_MAX || medium == UINT32_MAX || group == UINT32_MAX) {
        return Status::OutOfRange("index '" + path + "': too many instances, media or groups");
      }
      bool conflict = false;
      const int64_t ref = q.ColInt(5);
      if (ref <= 0) continue;
      uint32_t node = kNoNode;
      (void)mem.Store(inst, medium, group, static_cast<uint64_t>(q.ColInt(4)),
                      q.ColNull(6) ? 0 : static_cast<uint64_t>(q.ColInt(6)), q.ColInt(7),
                      static_cast<uint64_t>(q.ColInt(8)), static_cast<uint32_t>(ref), &conflict,
                      &node);
      if (!q.ColNull(10) && node != kNoNode) {
        parent_of.emplace_back(static_cast<uint64_t>(q.ColInt(10)), node);
      }
    }
    if (rc != SQLITE_DONE) return corrupt("blocks");
    mem.LinkParents(parent_of);
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
      LoadStep(rows);
      ApplyOutcome ignored;
      ApplyRow(r, &ignored);
    }
    if (rc != SQLITE_DONE) return corrupt("event_log");
    log_rows = rows;
    log_rows_pending = rows;
  }
  const int64_t dropped = counters.dropped_by_budget;
  counters = IndexerCounters{};
  load_peak_bytes = std::max(load_peak_bytes, mem.BudgetBytes());
  EvictIfNeeded();
  counters.dropped_by_budget += dropped;
  return Status::Ok();
}

void Indexer::Impl::LoadStep(int64_t row) {
  // The byte budget holds while the file is read, not only once it is: a file many times the
  // budget (SQLite keeps what the budget dropped) used to be read into memory whole first. Rows
  // read later are newer (the log after `blocks`), so each chunk gets a later LRU tick and the
  // budget drops the earliest read first.
  if (row % kLoadChunkRows != 0) return;
  mem.set_store_tick(tick.fetch_add(1, std::memory_order_relaxed) + 1);
  load_peak_bytes = std::max(load_peak_bytes, mem.BudgetBytes());
  EvictIfNeeded();
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

void Indexer::Impl::UpdateSqliteBytes() {
  Stmt q;
  if (q.Prepare(db, "SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()")
          .ok() &&
      q.Step() == SQLITE_ROW) {
    sqlite_bytes = q.ColInt(0);
  }
}

}  // namespace kvo
