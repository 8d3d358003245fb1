-- kvo prefix index, schema version 3 (PRAGMA user_version = 3; PRAGMA application_id =
-- 0x6B766F49, "kvoI"). Embedded in kvo_indexer and executed in one transaction when a new file is
-- created. See schemas/index.md for the meaning of every column and indexer/DESIGN.md for why.
--
-- Integers: engine block hashes and content keys are unsigned 64-bit values stored in SQLite's
-- signed INTEGER (two's complement); printf('%016x', col) shows them as hex.
-- Blobs: `hashes` and `content_keys` are arrays of u64 little-endian; `token_ids` are arrays of
-- int32 little-endian when token_width = 4, int64 little-endian when token_width = 8.

CREATE TABLE kvo_index_meta (
  key   TEXT PRIMARY KEY,
  value TEXT NOT NULL
) WITHOUT ROWID;

-- One row per source name ever seen; ids are never reused.
CREATE TABLE sources (
  source_id INTEGER PRIMARY KEY,
  name      TEXT NOT NULL UNIQUE
);

-- The checkpoint: last applied sequence per (source, DP rank), committed in the same transaction
-- as the log rows of that batch.
CREATE TABLE streams (
  source_id     INTEGER NOT NULL REFERENCES sources(source_id),
  dp_rank       INTEGER NOT NULL,
  last_seq      INTEGER NOT NULL,
  last_event_ts REAL    NOT NULL,
  updated_at    REAL    NOT NULL,
  PRIMARY KEY (source_id, dp_rank)
) WITHOUT ROWID;

-- Sources registered at run time (POST /register on `kvo index serve`), version 2. One row per
-- registered source name; `body` is the registration as kvo normalised it (JSON: endpoint,
-- replay_endpoint, type, model, lora_name, tenant_id, instance_id, block_size, dp_rank,
-- additional_salt). The source's checkpoint is its `streams` rows (same name), so a restarted
-- daemon resumes every registration from there. Version 1 files gain this table at open.
-- Version 3 adds `ownership` to event_log and to the key of blocks (version 2 files are migrated
-- at open: their rows get ownership '').
CREATE TABLE registrations (
  name       TEXT PRIMARY KEY,
  body       TEXT NOT NULL,
  created_at REAL NOT NULL
) WITHOUT ROWID;

-- Append-only ingest: one row per applied event, sequential rowid, no secondary index.
-- kind: 1 BlockStored, 2 BlockRemoved, 3 AllBlocksCleared.
-- Rows are folded into `blocks` by compaction and deleted in the same transaction.
CREATE TABLE event_log (
  id           INTEGER PRIMARY KEY,
  source_id    INTEGER NOT NULL,
  dp_rank      INTEGER NOT NULL,
  seq          INTEGER NOT NULL,
  ts           REAL    NOT NULL,
  seen_at      REAL    NOT NULL,
  kind         INTEGER NOT NULL,
  medium       TEXT    NOT NULL,
  group_idx    INTEGER NOT NULL,
  block_size   INTEGER NOT NULL,
  lora_name    TEXT,
  parent_hash  INTEGER,
  hashes       BLOB,
  content_keys BLOB,
  token_width  INTEGER NOT NULL DEFAULT 0,
  token_ids    BLOB,
  ownership    TEXT    NOT NULL DEFAULT ''
);

-- The keyed state: one row per held (source, rank, medium, ownership, group, engine hash).
-- ownership: '' for the framework's copy; a secondary tier's own copy (vLLM's `ownership`, e.g.
-- the KVCR tier's "kvcr") is a residency of its own, and removals match the one they name.
CREATE TABLE blocks (
  source_id   INTEGER NOT NULL,
  dp_rank     INTEGER NOT NULL,
  medium      TEXT    NOT NULL,
  ownership   TEXT    NOT NULL DEFAULT '',
  group_idx   INTEGER NOT NULL,
  engine_hash INTEGER NOT NULL,
  refcount    INTEGER NOT NULL,
  parent_hash INTEGER,
  content_key INTEGER,
  block_size  INTEGER NOT NULL,
  token_count INTEGER NOT NULL,
  token_width INTEGER NOT NULL DEFAULT 0,
  token_ids   BLOB,
  lora_name   TEXT,
  first_seq   INTEGER NOT NULL,
  last_seq    INTEGER NOT NULL,
  first_seen  REAL    NOT NULL,
  last_seen   REAL    NOT NULL,
  PRIMARY KEY (source_id, dp_rank, medium, ownership, group_idx, engine_hash)
) WITHOUT ROWID;

-- Compaction back-fills the content key of entries stored as unresolved placeholders once the
-- block's tokens are seen; a partial index keeps that cheap (it holds only keyless entries).
-- Only `blocks` (maintained by background compaction) has a secondary index; event_log has none.
CREATE INDEX blocks_keyless ON blocks (engine_hash) WHERE content_key IS NULL;

-- Audit views: names instead of ids, hashes in hex.
CREATE VIEW block_entries AS
  SELECT s.name AS source, b.dp_rank, b.medium, b.ownership, b.group_idx,
         printf('%016x', b.engine_hash) AS engine_hash_hex,
         printf('%016x', b.content_key) AS content_key_hex,
         printf('%016x', b.parent_hash) AS parent_hash_hex,
         b.refcount, b.block_size, b.token_count, b.lora_name,
         b.first_seq, b.last_seq,
         datetime(b.first_seen, 'unixepoch') AS first_seen_utc,
         datetime(b.last_seen, 'unixepoch') AS last_seen_utc
  FROM blocks b JOIN sources s USING (source_id);

CREATE VIEW stream_checkpoints AS
  SELECT s.name AS source, t.dp_rank, t.last_seq,
         datetime(t.last_event_ts, 'unixepoch') AS last_event_utc,
         datetime(t.updated_at, 'unixepoch') AS updated_utc,
         (SELECT count(*) FROM event_log l
           WHERE l.source_id = t.source_id AND l.dp_rank = t.dp_rank) AS log_rows_pending
  FROM streams t JOIN sources s USING (source_id);

INSERT INTO kvo_index_meta (key, value) VALUES ('format', 'kvo-prefix-index');
