// The public header of kvo_indexer: a durable prefix index over the KV events of many engines.
//
// An Indexer owns one SQLite file (schemas/index.sql) and an in-memory scoring structure:
//   - ApplyBatch() appends each decoded EventBatch to an append-only SQLite log (`event_log`) and
//     applies it to memory at once; pending rows are committed in batched transactions together
//     with the stream's last applied sequence (`streams`), so after kill -9 the durable index and
//     its checkpoint agree. Compact() folds the log into the keyed `blocks` table (background
//     thread or explicit call) and deletes the folded log rows.
//   - Score() and Explain() read memory only (never SQLite).
//   - Open() rebuilds memory from `blocks` plus the log tail (warm restart).
//
// Identity. A *stream* is (source, dp_rank): one publisher socket of one engine, with its own
// sequence numbers. An *instance* is scored per stream. A block is known by the engine's block
// hash (the 64-bit wire form: BlockHash::Low64(), so int and raw-bytes forms of one digest agree)
// and, when an event is self-describing (carries token ids), by kvo's content key (ContentKey()
// below, documented in schemas/index.md) so routers may ask with token ids.
//
// Event semantics (vllm-compat.md A.6, B.9):
//   - stores are reference-counted per (stream, medium, group, engine hash): duplicates count;
//   - a removal of a hash the stream does not hold on that medium/group is ignored and counted;
//   - AllBlocksCleared clears that stream's GPU entries (CPU and STORAGE are kept, as in vLLM);
//   - placeholder stores (no token ids) resolve through the engine-hash map of blocks seen before
//     (from any stream); an unknown placeholder hash is indexed by engine hash only;
//   - medium: "GPU", "CPU", "STORAGE", or any other string (kept verbatim); a missing medium is
//   GPU.
//
// Locking rule. Every method is thread-safe. Writers (ApplyBatch, ClearSource, Flush, Compact)
// are serialised by one ingest mutex; they update memory under an exclusive state lock held only
// for the in-memory part. SQLite is driven under a separate connection mutex: a flush takes the
// pending rows in O(1) and commits them while ingest continues. Readers (Score, Explain, Stats,
// Dump, LastSequence) take the state lock shared, so concurrent queries run in parallel with each
// other and never wait for SQLite. Lock order: connection, ingest, state (indexer/DESIGN.md).
// Callbacks (Dump) run under the shared state lock and must not call back into the Indexer.
// A failed automatic commit is returned by the ApplyBatch that triggered it (the batch itself is
// applied and stays pending; a later flush retries).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "common/result.h"
#include "common/status.h"
#include "events/event.h"

namespace kvo {

// ---------------------------------------------------------------------------------------------
// kvo's content key (schemas/index.md): a chained 64-bit hash of the token ids of each full block.
//   root(lora)  = XXH3_64("kvo-content-v1" || 0x00 || lora_name bytes)   (lora_name "" = no LoRA)
//   key_i       = XXH3_64(le64(key_{i-1}) || le64(token_0) || ... || le64(token_{bs-1}))
// with key_{-1} = root. Engine-independent (no seed), so instances with different hash seeds or
// algorithms share one key space. Extra keys (multimodal, cache_salt) are not part of it.
uint64_t ContentKeyRoot(std::string_view lora_name);
uint64_t ContentKey(uint64_t parent, std::span<const int64_t> block_tokens);
// The keys of `blocks` full blocks of `tokens` (blocks * block_size ids) chained after `parent`,
// into out[0, blocks); returns the last (`parent` when blocks is 0). Equal to ContentKey block by
// block; vLLM's block sizes (1 to 128, powers of two) are compiled for their length, which lets a
// block's token lanes overlap the previous key's finish (a 16-token chain ~30 % faster).
uint64_t ChainContentKeys(uint64_t parent, const int64_t* tokens, size_t block_size, size_t blocks,
                          uint64_t* out);
// Keys of every full block of `token_ids` (a trailing partial block is ignored).
// block_size <= 0 is InvalidArgument.
Result<std::vector<uint64_t>> ContentKeys(std::span<const int64_t> token_ids, int64_t block_size,
                                          std::string_view lora_name = {});

// ---------------------------------------------------------------------------------------------
struct IndexerOptions {
  // Byte budget of the index: the SQLite page cache (below) plus the in-memory structure. When
  // the structure exceeds the rest, least-recently-used blocks (stored or scored longest ago) are
  // dropped from memory (they stay in SQLite) and counted.
  size_t memory_budget_bytes = size_t{1} << 30;
  // SQLite page cache of the connection (PRAGMA cache_size), taken from memory_budget_bytes.
  // 0: min(64 MiB, memory_budget_bytes / 8). Must be below memory_budget_bytes.
  size_t sqlite_cache_bytes = 0;
  // Pending log rows (one per event) committed once this many are buffered...
  size_t flush_max_events = 8192;
  // ...or when the oldest pending row is this old (checked by ApplyBatch and the background
  // thread).
  int64_t flush_interval_ms = 10;
  // Compact when at least this many log rows are not yet folded into `blocks`.
  int64_t compact_min_log_rows = 200000;
  // Log rows folded per compaction transaction (bounds how long a compaction step holds the
  // ingest mutex).
  int64_t compact_chunk_rows = 20000;
  // Start a thread that flushes every flush_interval_ms and compacts when due. Off: the owner
  // calls Flush()/Compact() (tests do, for determinism).
  bool background_thread = true;
  // Block size used to cut token ids when a query gives none.
  int64_t default_block_size = 16;
  // Open without writing anything (audit commands while a daemon runs): ApplyBatch, ClearSource,
  // Flush and Compact return FailedPrecondition. The file must already exist.
  bool read_only = false;
  // Create the file when missing (ignored when read_only).
  bool create_if_missing = true;
  // Time of "first/last seen" and flush deadlines; SystemClock() when null.
  Clock* clock = nullptr;
};

// What one ApplyBatch did.
struct ApplyOutcome {
  bool applied = false;          // false: seq <= the stream's last sequence (already applied)
  int64_t block_events = 0;      // hashes carried by the applied events
  int64_t unknown_removals = 0;  // removals ignored because the stream did not hold the hash
  // Events left out because they do not fit the index (a 17th residency, a 257th KV-cache group,
  // a medium name over its bound); the batch's other events are applied. `refused_reason` names
  // the first (bounded; empty when none).
  int64_t refused_events = 0;
  std::string refused_reason;
};

struct ScoreQuery {
  // Exactly one of the two must be non-empty.
  std::vector<int64_t> token_ids;      // cut into blocks of block_size, keyed by ContentKey
  std::vector<uint64_t> block_hashes;  // engine block hashes (64-bit wire form)
  std::optional<int64_t> block_size;   // default IndexerOptions::default_block_size
  std::optional<std::string> lora_name;
  // Optional, with token_ids: their content keys, already computed by the caller with this block
  // size and LoRA name (ContentKeys, or the router API's KeyHelper while it parsed the body), one
  // per complete block; used instead of hashing the tokens again. Any other count is
  // InvalidArgument.
  std::vector<uint64_t> content_keys;
  // Weight per medium name; media not named here get the defaults GPU 1.0, CPU 0.8,
  // STORAGE 0.5, anything else 1.0 (as llm-d weighs unknown tiers).
  std::map<std::string, double> weights;
  // Only these sources (all streams of each); empty: every source. An unknown name is
  // InvalidArgument naming it.
  std::vector<std::string> sources;
};

struct InstanceScore {
  std::string source;
  int64_t dp_rank = 0;
  int64_t prefix_blocks = 0;  // longest run of consecutive query blocks held from block 0
  int64_t prefix_tokens = 0;  // prefix_blocks * block size (engine block size for hash queries)
  // Blocks of that prefix present on each medium (a block on GPU and CPU counts for both).
  std::map<std::string, int64_t> blocks_per_medium;
  double score = 0;  // sum over the prefix of the best weight among the media holding each block
};

struct ScoreResult {
  int64_t query_blocks = 0;
  int64_t block_size = 0;
  // Every known stream passing the source filter, best first (score, then prefix, then name).
  std::vector<InstanceScore> instances;
};

// Explain: one routing answer block by block.
struct ExplainHolder {
  std::string source;
  int64_t dp_rank = 0;
  std::string medium;
  std::string ownership;  // a secondary tier's own copy (vLLM's `ownership`); "" = framework
  int64_t group = 0;
  int64_t refcount = 0;
  uint64_t since_seq = 0;  // sequence of the store that made the stream hold it
};
struct ExplainBlock {
  int64_t index = 0;
  uint64_t content_key = 0;  // 0 when the query was by engine hash and the block has no key
  uint64_t engine_hash = 0;  // 0 when unknown
  bool known = false;        // present in memory
  std::vector<ExplainHolder> holders;
};
struct ExplainInstance {
  std::string source;
  int64_t dp_rank = 0;
  int64_t prefix_blocks = 0;
  // Why the prefix ends at prefix_blocks: "end of prompt", "block unknown to the index (never
  // stored, removed everywhere, or dropped by the memory budget)", "not held by this instance
  // (held by N others)".
  std::string break_reason;
};
struct ExplainResult {
  ScoreResult score;
  std::vector<ExplainBlock> blocks;
  std::vector<ExplainInstance> instances;
};

struct MediumStats {
  std::string source;
  int64_t dp_rank = 0;
  std::string medium;  // the residency: "CPU", or "CPU/kvcr" for a copy owned by "kvcr"
  int64_t blocks = 0;  // held entries in memory (distinct engine hash x group)
};

struct StreamStats {
  std::string source;
  int64_t dp_rank = 0;
  uint64_t last_seq = 0;     // last applied (memory; >= durable)
  uint64_t durable_seq = 0;  // last committed to SQLite
  double last_event_ts = 0;  // EventBatch.ts of the last applied batch
  bool has_seq = false;      // false: nothing applied since creation or ClearSource
};

struct IndexerCounters {
  int64_t batches_applied = 0;
  int64_t batches_duplicate = 0;  // seq <= last: skipped
  int64_t events = 0;             // KvEvents applied
  int64_t block_events = 0;       // hashes in those events
  int64_t stores = 0;             // stored hashes (duplicates included)
  int64_t duplicate_stores = 0;   // stores of a hash the stream already held there
  int64_t removals = 0;           // removed hashes that were held
  int64_t unknown_removals = 0;   // removals of hashes not held (ignored)
  int64_t clears = 0;             // AllBlocksCleared applied
  int64_t source_clears = 0;      // ClearSource and ClearStream calls
  int64_t placeholders_resolved = 0;
  int64_t placeholders_unresolved = 0;  // indexed by engine hash only
  int64_t unresolved_parents = 0;       // self-describing events whose parent's content was unknown
  int64_t content_mismatches = 0;       // token count not n_hashes * block_size: content not keyed
  int64_t refused_events = 0;           // events that did not fit the index (ApplyOutcome)
  int64_t dropped_by_budget = 0;        // blocks dropped from memory by the byte budget
  int64_t flushes = 0;                  // committed transactions
  int64_t compactions = 0;              // compaction steps
  int64_t scores = 0;                   // Score/Explain calls
  // Blocks the scoring walks resolved through a chain hint / through the hash table (a low
  // share of hints: prompts that branch where the index last saw another branch, or a restart).
  int64_t walk_blocks_hinted = 0;
  int64_t walk_blocks_looked_up = 0;
};

struct IndexerStats {
  std::vector<MediumStats> per_medium;  // sorted by source, rank, medium
  std::vector<StreamStats> streams;     // sorted by source, rank
  IndexerCounters counters;
  int64_t blocks_in_memory = 0;   // distinct blocks (nodes)
  int64_t entries_in_memory = 0;  // (stream, medium, group, block) entries
  size_t memory_bytes = 0;        // resident bytes of the scoring structure
  size_t memory_budget_bytes = 0;
  // The scoring structure's largest size (budget accounting) while the file was opened: the
  // budget holds during the load, within one chunk of 1,024 rows.
  size_t load_peak_bytes = 0;
  size_t sqlite_cache_bytes = 0;    // the page cache's share of the budget
  int64_t sqlite_memory_bytes = 0;  // what SQLite holds now (process-wide: sqlite3_memory_used)
  int64_t log_rows_pending = 0;     // log rows not yet compacted
  int64_t sqlite_bytes = 0;         // database file size (page_count * page_size)
  int64_t schema_version = 0;
};

// One held entry, for dump.
struct DumpEntry {
  std::string source;
  int64_t dp_rank = 0;
  std::string medium;
  std::string ownership;  // "" = the framework's copy
  int64_t group = 0;
  uint64_t engine_hash = 0;
  uint64_t content_key = 0;  // 0: not content-keyed (placeholder without a known origin)
  int64_t block_size = 0;
  int64_t refcount = 0;
  uint64_t since_seq = 0;
};

// A source registered at run time (the daemon's POST /register), as stored in the file.
struct StoredRegistration {
  std::string name;
  std::string body;  // the registration's JSON, as the service wrote it
};

class Indexer {
 public:
  // The schema version this build writes (PRAGMA user_version).
  static constexpr int64_t kSchemaVersion = 3;

  // Opens (or creates) the index at `path`. Refuses, with a Corruption / FailedPrecondition error
  // naming the file and the reason, a file that is not SQLite, is corrupt, belongs to another
  // application (foreign tables or application_id), or has a newer schema version; such a file is
  // never modified. Older schema versions are migrated in one transaction.
  static Result<std::unique_ptr<Indexer>> Open(const std::string& path,
                                               const IndexerOptions& options = {});

  ~Indexer();  // flushes pending rows (best effort) and stops the background thread
  Indexer(const Indexer&) = delete;
  Indexer& operator=(const Indexer&) = delete;

  // Applies one decoded batch received from stream (source, dp_rank) with sequence `seq`.
  // A batch with seq <= LastSequence(source, dp_rank) is skipped (applied = false), so replay
  // overlap is harmless. `source` must be non-empty (InvalidArgument otherwise) and dp_rank >= 0;
  // the caller usually passes batch.data_parallel_rank.value_or(rank of the socket).
  // The batch is visible to Score at return; it is durable after the next flush (automatic).
  Result<ApplyOutcome> ApplyBatch(std::string_view source, int64_t dp_rank, uint64_t seq,
                                  const EventBatch& batch);

  // Forgets everything of `source` (every rank, every medium) and its sequence checkpoints: for a
  // publisher restart or a replay that cannot reach back. Durable at return. The next batch of
  // any sequence is applied. Unknown source: Ok (nothing to do).
  Status ClearSource(std::string_view source);
  // The same for one stream (source, dp_rank): its sibling ranks keep their entries and
  // checkpoints. Unknown stream: Ok.
  Status ClearStream(std::string_view source, int64_t dp_rank);

  // Registrations (schemas/index.sql `registrations`): stored, replaced (same name) and deleted
  // durably at return; listed sorted by name. The checkpoints of a registered source are its
  // streams' (LastSequence), kept by the same file.
  Status PutRegistration(std::string_view name, std::string_view body);
  Status DeleteRegistration(std::string_view name);
  Result<std::vector<StoredRegistration>> Registrations() const;

  // Last applied sequence of a stream; NotFound when nothing was applied (new or cleared).
  // After a restart this is the durable checkpoint: resume replay from LastSequence + 1.
  Result<uint64_t> LastSequence(std::string_view source, int64_t dp_rank = 0) const;

  // Commits pending rows and checkpoints now.
  Status Flush();
  // Folds up to `max_rows` log rows (all when < 0) into `blocks`; flushes first.
  Status Compact(int64_t max_rows = -1);

  Result<ScoreResult> Score(const ScoreQuery& query) const;
  Result<ExplainResult> Explain(const ScoreQuery& query) const;

  // The router API's tiered match (indexer/service/router_api.h): for every stream of
  // `query.sources` (every stream when empty; weights ignored), the GPU prefix, then the boundary
  // reached through blocks on GPU or CPU, then on GPU, CPU or STORAGE/DISK, in blocks. Streams not
  // seen (or cleared) are left out. Same cost class as Score (word-parallel walk, no holder lists).
  struct TieredMatch {
    std::string source;
    int64_t dp_rank = 0;
    int64_t gpu = 0;
    int64_t cpu = 0;
    int64_t disk = 0;
  };
  Result<std::vector<TieredMatch>> Tiered(const ScoreQuery& query) const;

  // Tiered's walk over every source, fed content keys as they are computed: the router API's key
  // helper walks a /query's blocks while the body is still being read. The answer equals
  // Tiered's for the same keys. Holds the index's reader lock from StartTieredWalk until Finish
  // (or destruction), on the thread that called StartTieredWalk, which must also call Walk and
  // Finish: keep it short, and never wait meanwhile for anything that needs the write lock.
  class TieredWalk {
   public:
    ~TieredWalk();  // releases the lock when Finish was not called
    TieredWalk(const TieredWalk&) = delete;
    TieredWalk& operator=(const TieredWalk&) = delete;
    // The next blocks' content keys (ContentKey with the query's block size and LoRA). False once
    // the walk is over: later keys change nothing and need not be computed.
    bool Walk(std::span<const uint64_t> content_keys);
    // The answer, for the blocks walked; releases the lock. Once only.
    std::vector<TieredMatch> Finish();

   private:
    friend class Indexer;
    struct State;
    explicit TieredWalk(std::unique_ptr<State> state);
    std::unique_ptr<State> state_;
  };
  std::unique_ptr<TieredWalk> StartTieredWalk() const;

  IndexerStats Stats() const;
  // Calls fn for every held entry (sorted by source, rank, medium, group, engine hash) until it
  // returns false.
  void Dump(const std::function<bool(const DumpEntry&)>& fn) const;

  const std::string& path() const;

 private:
  struct Impl;
  explicit Indexer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvo
