// `kvo bench indexer`: block events ingested into the SQLite-backed Indexer (baseline: one
// autocommit INSERT per block event), Score latency for a 128k-token prompt (8192 blocks of 16)
// over 100 sources with overlapping prefixes (baseline: one SQL lookup per block on the compacted
// `blocks` table), and resident bytes per indexed entry (baseline: an unordered_map of vectors).
#include <arpa/inet.h>
#include <malloc.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <random>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "bench/bench.h"
#include "common/file_system.h"
#include "indexer/indexer.h"
#include "indexer/service/router_api.h"
#include "indexer/service/service.h"

namespace kvo::bench {
namespace {

using Clk = std::chrono::steady_clock;

double Seconds(Clk::time_point a, Clk::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

size_t HeapInUse() {
  struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
}

IndexerOptions BenchOptionsFor() {
  IndexerOptions o;
  o.background_thread = false;
  o.flush_max_events = 4096;
  o.flush_interval_ms = 1'000'000;
  o.memory_budget_bytes = size_t{8} << 30;
  return o;
}

// GPU-style batches: one self-describing BlockStored of 16 blocks (256 tokens) per batch, and
// every fourth batch one BlockRemoved of 16 earlier hashes.
std::vector<EventBatch> IngestBatches(size_t n_batches) {
  std::vector<EventBatch> out;
  std::mt19937_64 rng(42);
  uint64_t next_hash = 1;
  for (size_t b = 0; b < n_batches; ++b) {
    EventBatch batch;
    batch.ts = 1.7e9 + static_cast<double>(b);
    if (b % 4 == 3) {
      BlockRemoved rm;
      for (int i = 0; i < 16; ++i) rm.block_hashes.push_back(BlockHash::Uint(next_hash - 40 + i));
      rm.medium = "GPU";
      batch.events.push_back(rm);
    } else {
      BlockStored st;
      for (int i = 0; i < 16; ++i) st.block_hashes.push_back(BlockHash::Uint(next_hash++));
      st.block_size = 16;
      st.token_ids.resize(256);
      for (auto& t : st.token_ids) t = static_cast<int64_t>(rng() % 150000);
      st.medium = "GPU";
      batch.events.push_back(st);
    }
    out.push_back(std::move(batch));
  }
  return out;
}

int IngestCase(const BenchOptions& o) {
  ScopedTempDir dir("bench-indexer");
  if (dir.path().empty()) return 1;
  const size_t n_batches = o.quick ? 2000 : 40000;
  const auto batches = IngestBatches(n_batches);
  size_t block_events = 0;
  for (const auto& b : batches) block_events += CountBlockEvents(b);

  // As the daemon runs it: the background thread commits while the caller applies.
  IndexerOptions io = BenchOptionsFor();
  io.background_thread = true;
  io.flush_interval_ms = 10;
  io.compact_min_log_rows = int64_t{1} << 40;  // compaction measured separately below
  auto idx = Indexer::Open(dir.path() + "/ingest.db", io);
  if (!idx.ok()) {
    std::fprintf(stderr, "indexer bench: %s\n", idx.status().ToString().c_str());
    return 1;
  }
  const auto t0 = Clk::now();
  for (size_t i = 0; i < batches.size(); ++i) {
    if (!(*idx)->ApplyBatch("engine", 0, i + 1, batches[i]).ok()) return 1;
  }
  if (!(*idx)->Flush().ok()) return 1;
  const auto t1 = Clk::now();
  const double rate = static_cast<double>(block_events) / Seconds(t0, t1);
  // Breakdown (notes): the in-memory apply alone, then one commit of all rows.
  double apply_rate = 0, commit_rate = 0;
  {
    IndexerOptions bo = BenchOptionsFor();
    bo.flush_max_events = size_t{1} << 40;
    auto split = Indexer::Open(dir.path() + "/split.db", bo);
    if (!split.ok()) return 1;
    const auto a0 = Clk::now();
    for (size_t i = 0; i < batches.size(); ++i) {
      if (!(*split)->ApplyBatch("engine", 0, i + 1, batches[i]).ok()) return 1;
    }
    const auto a1 = Clk::now();
    if (!(*split)->Flush().ok()) return 1;
    const auto a2 = Clk::now();
    apply_rate = static_cast<double>(block_events) / Seconds(a0, a1);
    commit_rate = static_cast<double>(block_events) / Seconds(a1, a2);
  }
  // Compaction (background work, not on the ingest path), reported in the notes.
  const auto c0 = Clk::now();
  if (!(*idx)->Compact().ok()) return 1;
  const double compact_rate = static_cast<double>(block_events) / Seconds(c0, Clk::now());

  // Baseline: one autocommit INSERT per block event, WAL + synchronous=NORMAL, random hash key.
  sqlite3* db = nullptr;
  const std::string base_path = dir.path() + "/baseline.db";
  if (sqlite3_open(base_path.c_str(), &db) != SQLITE_OK) return 1;
  sqlite3_exec(db,
               "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; CREATE TABLE blocks(hash "
               "INTEGER PRIMARY KEY, parent INTEGER, medium TEXT, size INTEGER, ts REAL);",
               nullptr, nullptr, nullptr);
  sqlite3_stmt* ins = nullptr;
  sqlite3_prepare_v2(db, "INSERT OR REPLACE INTO blocks VALUES (?, ?, 'GPU', 16, ?)", -1, &ins,
                     nullptr);
  std::mt19937_64 rng(7);
  const size_t base_n = o.quick ? 500 : 5000;
  const auto b0 = Clk::now();
  for (size_t i = 0; i < base_n; ++i) {
    sqlite3_bind_int64(ins, 1, static_cast<int64_t>(rng()));
    sqlite3_bind_int64(ins, 2, static_cast<int64_t>(rng()));
    sqlite3_bind_double(ins, 3, 1.7e9);
    sqlite3_step(ins);
    sqlite3_reset(ins);
  }
  const double base_rate = static_cast<double>(base_n) / Seconds(b0, Clk::now());
  sqlite3_finalize(ins);
  sqlite3_close(db);

  BenchResult r;
  r.area = "indexer";
  r.name = "ingest_block_events";
  r.unit = "block_events/s";
  r.value = rate;
  r.baseline_name = "sqlite autocommit insert per block event";
  r.baseline = base_rate;
  r.target = 500000;
  char notes[400];
  std::snprintf(notes, sizeof(notes),
                "%zu block events in batches of 16 (1 in 4 a removal), self-describing tokens, "
                "durable at the end (apply alone %.0f/s, SQLite commit alone %.0f/s); compaction "
                "into blocks afterwards %.0f block events/s",
                block_events, apply_rate, commit_rate, compact_rate);
  r.notes = notes;
  PrintResult(r, o);
  return 0;
}

// The scoring workload: a 128k-token prompt; 100 sources each hold a prefix of it of random
// depth (GPU, with the older part also or only on CPU, some on STORAGE), plus `noise` unique
// blocks of their own so the tables are far larger than the caches.
struct ScoringSetup {
  std::vector<int64_t> prompt;
  std::vector<uint64_t> hashes;  // engine hashes of the prompt blocks
  std::vector<int64_t> depth;    // per source
};

ScoringSetup BuildScoring(Indexer& idx, size_t n_sources, size_t n_blocks, size_t noise,
                          uint64_t* entries, const std::string& name_suffix = "") {
  ScoringSetup s;
  std::mt19937_64 rng(1234);
  s.prompt.resize(n_blocks * 16);
  for (auto& t : s.prompt) t = static_cast<int64_t>(rng() % 150000);
  const auto keys = *ContentKeys(s.prompt, 16);
  for (uint64_t k : keys) s.hashes.push_back(k * 0x9E3779B97F4A7C15ull + 1);
  *entries = 0;
  for (size_t src = 0; src < n_sources; ++src) {
    const std::string name = "engine-" + std::to_string(src) + name_suffix;
    // Depth: a quarter hold the whole prompt, the rest a random prefix.
    const size_t depth = src % 4 == 0 ? n_blocks : rng() % n_blocks;
    s.depth.push_back(static_cast<int64_t>(depth));
    uint64_t seq = 0;
    for (size_t first = 0; first < depth; first += 64) {
      const size_t n = std::min<size_t>(64, depth - first);
      BlockStored st;
      for (size_t i = first; i < first + n; ++i)
        st.block_hashes.push_back(BlockHash::Uint(s.hashes[i]));
      if (first > 0) st.parent_block_hash = BlockHash::Uint(s.hashes[first - 1]);
      st.token_ids.assign(s.prompt.begin() + static_cast<long>(first * 16),
                          s.prompt.begin() + static_cast<long>((first + n) * 16));
      st.block_size = 16;
      // The first half of the held prefix is also on CPU; blocks past 3/4 of it only on CPU.
      st.medium = first >= depth * 3 / 4 ? "CPU" : "GPU";
      EventBatch b;
      b.events.push_back(st);
      if (first < depth / 2 || first >= depth * 3 / 4) {
        BlockStored ph;
        ph.block_hashes = st.block_hashes;
        ph.medium = src % 10 == 0 ? "STORAGE" : "CPU";
        if (st.medium != "CPU") b.events.push_back(ph);
      }
      *entries += CountBlockEvents(b);
      (void)idx.ApplyBatch(name, 0, ++seq, b);
    }
    for (size_t first = 0; first < noise; first += 64) {
      BlockStored st;
      for (size_t i = 0; i < 64; ++i) st.block_hashes.push_back(BlockHash::Uint(rng()));
      st.block_size = 16;
      st.medium = "GPU";
      EventBatch b;
      b.events.push_back(st);
      *entries += 64;
      (void)idx.ApplyBatch(name, 0, ++seq, b);
    }
  }
  return s;
}

int ScoreCase(const BenchOptions& o) {
  ScopedTempDir dir("bench-indexer");
  if (dir.path().empty()) return 1;
  const size_t n_sources = 100;
  const size_t n_blocks = 8192;
  const size_t noise = o.quick ? 512 : 8192;
  const std::string path = dir.path() + "/score.db";
  auto opened = Indexer::Open(path, BenchOptionsFor());
  if (!opened.ok()) {
    std::fprintf(stderr, "indexer bench: %s\n", opened.status().ToString().c_str());
    return 1;
  }
  Indexer& idx = **opened;
  uint64_t entries = 0;
  const ScoringSetup s = BuildScoring(idx, n_sources, n_blocks, noise, &entries);
  if (!idx.Compact().ok()) return 1;

  auto measure = [&](const ScoreQuery& q, int iters, std::vector<double>* lat) {
    for (int i = 0; i < iters; ++i) {
      const auto a = Clk::now();
      auto r = idx.Score(q);
      const auto b = Clk::now();
      if (!r.ok() || r->instances.empty()) return false;
      lat->push_back(Seconds(a, b) * 1e3);
    }
    return true;
  };
  const int iters = o.quick ? 30 : 300;
  ScoreQuery by_hash;
  by_hash.block_hashes = s.hashes;
  by_hash.block_size = 16;
  ScoreQuery by_tokens;
  by_tokens.token_ids = s.prompt;
  std::vector<double> lat_hash, lat_tokens;
  if (!measure(by_hash, 5, &lat_hash)) return 1;  // warm-up
  lat_hash.clear();
  if (!measure(by_hash, iters, &lat_hash) || !measure(by_tokens, iters, &lat_tokens)) return 1;
  // Correctness of the measured answer: each source's prefix is its held depth.
  auto check = idx.Score(by_hash);
  int64_t wrong = 0;
  for (const auto& inst : check->instances) {
    const size_t src = std::stoul(inst.source.substr(7));
    wrong += inst.prefix_blocks != s.depth[src] ? 1 : 0;
  }

  // Baseline: one SQL point lookup per block on the compacted `blocks` table, walking until
  // every source has dropped out.
  // The baseline gets its own index on engine_hash (built outside the timing).
  sqlite3* db = nullptr;
  if (sqlite3_open(path.c_str(), &db) != SQLITE_OK) return 1;
  sqlite3_exec(db, "CREATE INDEX IF NOT EXISTS bench_by_hash ON blocks (engine_hash)", nullptr,
               nullptr, nullptr);
  sqlite3_stmt* q = nullptr;
  sqlite3_prepare_v2(db, "SELECT source_id, dp_rank FROM blocks WHERE engine_hash = ?", -1, &q,
                     nullptr);
  std::vector<double> lat_sql;
  const int sql_iters = o.quick ? 2 : 5;
  for (int it = 0; it < sql_iters; ++it) {
    const auto a = Clk::now();
    std::unordered_map<int64_t, int64_t> alive_depth;  // source -> depth while alive
    std::vector<int64_t> alive;
    for (size_t i = 0; i < s.hashes.size(); ++i) {
      sqlite3_bind_int64(q, 1, static_cast<int64_t>(s.hashes[i]));
      std::vector<int64_t> holders;
      while (sqlite3_step(q) == SQLITE_ROW) holders.push_back(sqlite3_column_int64(q, 0));
      sqlite3_reset(q);
      if (i == 0) alive = holders;
      std::vector<int64_t> next;
      for (int64_t x : alive) {
        if (std::find(holders.begin(), holders.end(), x) != holders.end()) {
          next.push_back(x);
          alive_depth[x] = static_cast<int64_t>(i) + 1;
        }
      }
      alive.swap(next);
      if (alive.empty()) break;
    }
    lat_sql.push_back(Seconds(a, Clk::now()) * 1e3);
  }
  sqlite3_finalize(q);
  sqlite3_close(db);

  const IndexerStats st = idx.Stats();
  char notes[320];
  for (const char* which : {"p50", "p99"}) {
    const double p = which[1] == '5' ? 50 : 99;
    const bool p99 = p == 99;
    BenchResult r;
    r.area = "indexer";
    r.name = std::string("score_128k_tokens_100_sources_by_hash_") + which;
    r.unit = "us";
    r.value = Percentile(lat_hash, p) * 1e3;
    r.baseline_name = "one sqlite lookup per block";
    r.baseline = Percentile(lat_sql, p) * 1e3;
    std::snprintf(notes, sizeof(notes),
                  "8192 blocks, 100 sources, %lld blocks / %lld entries in memory, %d wrong "
                  "prefixes; lower is better%s",
                  static_cast<long long>(st.blocks_in_memory),
                  static_cast<long long>(st.entries_in_memory), static_cast<int>(wrong),
                  p99 ? (r.value < 500 ? "; target < 500 us [target met]"
                                       : "; target < 500 us [below target]")
                      : "");
    r.notes = notes;
    PrintResult(r, o);
    BenchResult t = r;
    t.name = std::string("score_128k_tokens_100_sources_by_tokens_") + which;
    t.value = Percentile(lat_tokens, p) * 1e3;
    t.notes = std::string(
                  "includes computing 8192 content keys from 131072 token ids; lower is "
                  "better") +
              (p99 ? (t.value < 500 ? "; target < 500 us [target met]"
                                    : "; target < 500 us [below target]")
                   : "");
    PrintResult(t, o);
  }

  // Resident bytes per entry: ours vs the textbook structure holding the same information
  // (llm-d style: content key -> vector of holders {instance, medium, group, refcount, since},
  // plus engine hash -> content key), heap measured with mallinfo2.
  struct Holder {
    uint16_t instance;
    uint8_t medium;
    uint8_t group;
    uint16_t refcount;
    uint64_t since;
  };
  size_t naive_entries = 0;
  std::vector<DumpEntry> entries_copy;
  idx.Dump([&](const DumpEntry& e) {
    entries_copy.push_back(e);
    return true;
  });
  const size_t before = HeapInUse();
  {
    std::unordered_map<uint64_t, std::vector<Holder>> by_key;
    std::unordered_map<uint64_t, uint64_t> engine_to_key;
    for (const DumpEntry& e : entries_copy) {
      const uint64_t key = e.content_key != 0 ? e.content_key : e.engine_hash;
      by_key[key].push_back(Holder{static_cast<uint16_t>(std::stoul(e.source.substr(7))),
                                   static_cast<uint8_t>(e.medium.size()),
                                   static_cast<uint8_t>(e.group), static_cast<uint16_t>(e.refcount),
                                   e.since_seq});
      engine_to_key[e.engine_hash] = key;
      ++naive_entries;
    }
    const size_t naive_bytes = HeapInUse() - before;
    BenchResult r;
    r.area = "indexer";
    r.name = "resident_bytes_per_entry";
    r.unit = "bytes";
    r.value = static_cast<double>(st.memory_bytes) / static_cast<double>(st.entries_in_memory);
    r.baseline_name = "unordered_map<key, vector<holder>> + engine map";
    r.baseline = static_cast<double>(naive_bytes) / static_cast<double>(naive_entries);
    std::snprintf(notes, sizeof(notes),
                  "entry = (source, rank, medium, group, block); %.1f bytes per distinct block "
                  "(%lld blocks, %zu allocated bytes); lower is better; target <= 100 %s",
                  static_cast<double>(st.memory_bytes) / static_cast<double>(st.blocks_in_memory),
                  static_cast<long long>(st.blocks_in_memory), st.memory_bytes,
                  r.value <= 100 ? "[target met]" : "[below target]");
    r.notes = notes;
    PrintResult(r, o);
  }
  return wrong == 0 ? 0 : 1;
}

// A router's connection to the indexer: HTTP/1.1 keep-alive over loopback, one request at a time.
class LoopbackHttp {
 public:
  explicit LoopbackHttp(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
    int one = 1;
    if (fd_ >= 0) ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  ~LoopbackHttp() {
    if (fd_ >= 0) ::close(fd_);
  }
  bool ok() const { return fd_ >= 0; }
  // The status code (0 on a transport failure); *body gets the answer.
  int Post(const std::string& path, const std::string& payload, std::string* body) {
    const std::string head = "POST " + path +
                             " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                             "application/json\r\nContent-Length: " +
                             std::to_string(payload.size()) + "\r\n\r\n";
    // The header, then the body from where it lies (MSG_MORE: one segment train, no copy).
    if (!SendAll(head, MSG_MORE) || !SendAll(payload, 0)) return 0;
    size_t header_end;
    while ((header_end = buf_.find("\r\n\r\n")) == std::string::npos) {
      if (!Read()) return 0;
    }
    const std::string head_in = buf_.substr(0, header_end);
    const int status = head_in.size() > 12 ? std::atoi(head_in.c_str() + 9) : 0;
    size_t length = 0;
    for (size_t pos = 0; pos < head_in.size();) {
      size_t eol = head_in.find("\r\n", pos);
      if (eol == std::string::npos) eol = head_in.size();
      std::string line = head_in.substr(pos, eol - pos);
      for (char& c : line) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (line.rfind("content-length:", 0) == 0)
        length = std::strtoull(line.c_str() + 15, nullptr, 10);
      pos = eol + 2;
    }
    while (buf_.size() < header_end + 4 + length) {
      if (!Read()) return 0;
    }
    body->assign(buf_, header_end + 4, length);
    buf_.erase(0, header_end + 4 + length);
    return status;
  }

 private:
  bool SendAll(const std::string& data, int flags) {
    for (size_t off = 0; off < data.size();) {
      const ssize_t n = ::send(fd_, data.data() + off, data.size() - off, MSG_NOSIGNAL | flags);
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return true;
  }
  bool Read() {
    char tmp[65536];
    const ssize_t n = ::recv(fd_, tmp, sizeof tmp, 0);
    if (n <= 0) return false;
    buf_.append(tmp, static_cast<size_t>(n));
    return true;
  }
  int fd_ = -1;
  std::string buf_;
};

// The process's minor page faults so far (every thread: the server's and the client's): a request
// that faults in fresh pages for its body or its answers pays the kernel ~0.1-1 us per 4 KiB.
int64_t MinorFaults() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

// CPU time the hypervisor gave to other guests, all CPUs together (/proc/stat's "steal", in
// milliseconds; -1 where it cannot be read): on a virtual machine whose vCPUs are descheduled for
// milliseconds, no process meets a sub-millisecond p99, and the note says so.
double StealMs() {
  std::FILE* f = std::fopen("/proc/stat", "r");
  if (f == nullptr) return -1;
  unsigned long long v[8] = {};
  const int n = std::fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2],
                            &v[3], &v[4], &v[5], &v[6], &v[7]);
  std::fclose(f);
  const long hz = ::sysconf(_SC_CLK_TCK);
  return n == 8 && hz > 0 ? static_cast<double>(v[7]) * 1000.0 / static_cast<double>(hz) : -1;
}

std::string P99Note(double value_us, double target_us) {
  char b[96];
  std::snprintf(b, sizeof b, "; target p99 < %.0f us %s", target_us,
                value_us < target_us ? "[target met]" : "[below target]");
  return b;
}

// The parse of the same /query with Python's json.dumps separators.
std::string SpacedNote(size_t bytes, double parse_us) {
  char b[160];
  std::snprintf(
      b, sizeof b,
      " (the list as Python's json.dumps writes it, \", \" between ids, %zu bytes: parse %.0f us)",
      bytes, parse_us);
  return b;
}

// The slowest samples of a run with their places in it (a tail that clusters or recurs points
// at background work; one spread over the run, at the host).
std::string SlowestNote(const std::vector<double>& lat) {
  std::vector<size_t> order(lat.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  const size_t k = std::min<size_t>(4, order.size());
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                    [&](size_t a, size_t b) { return lat[a] > lat[b]; });
  std::string out = "; slowest of " + std::to_string(lat.size()) + ":";
  for (size_t i = 0; i < k; ++i) {
    char b[48];
    std::snprintf(b, sizeof b, " %.0f us (#%zu)", lat[order[i]], order[i]);
    out += b;
  }
  return out;
}

// /query's note: where its keys were hashed and walked, and the helper's and the served handler's
// mean times (diagnostics of the HTTP figure, not figures of their own).
std::string KeysNote(bool helper, double on_helper, double in_walk, double start_us, double wait_us,
                     double served_us) {
  char b[400];
  if (!helper) {
    std::snprintf(b, sizeof b,
                  "content keys hashed and walked in the handler (key helper off); the handler "
                  "served over HTTP: mean %.0f us; ",
                  served_us);
    return b;
  }
  std::snprintf(b, sizeof b,
                "content keys hashed and walked on the key helper for %.0f of %.0f queries (its "
                "start after the job was posted: mean %.0f us; the handler's wait for it after "
                "the list was read: mean %.0f us); the handler served over HTTP: mean %.0f us; ",
                on_helper, on_helper + in_walk, start_us, wait_us, served_us);
  return b;
}

// The router API over loopback HTTP against the in-process tiered walk of the same index, same
// run: /query_by_hash and /query for a 128k-token prompt (8192 blocks of 16) over 100 registered
// instances; then /register of many sources (each a stream thread and a ZeroMQ SUB socket) and
// /unregister of them, per-request latency.
int RouterApiCase(const BenchOptions& o) {
  ScopedTempDir dir("bench-router");
  if (dir.path().empty()) return 1;
  IndexerConfig cfg;
  cfg.db = dir.path() + "/router.db";
  cfg.http = "127.0.0.1:0";
  cfg.max_query_tokens = 1 << 20;
  ServiceOptions so;
  so.index = BenchOptionsFor();
  // KVO_BENCH_NO_KEY_HELPER=1: /query hashes its content keys in the walk (the comparison run).
  so.parallel_query_keys = std::getenv("KVO_BENCH_NO_KEY_HELPER") == nullptr;
  // KVO_BENCH_NO_FOLLOW=1: query bodies read whole before a worker takes them (the comparison run).
  so.follow_query_bodies = std::getenv("KVO_BENCH_NO_FOLLOW") == nullptr;
  // KVO_BENCH_NO_ARRIVING=1: a followed /query body is parsed once complete (the comparison run).
  so.parse_arriving_queries = std::getenv("KVO_BENCH_NO_ARRIVING") == nullptr;
  // KVO_BENCH_NO_LIST_HELPER=1: an arriving list parsed by the handler alone (the comparison run;
  // the service runs the helper only on machines of ServiceOptions::list_helper_min_cpus CPUs).
  so.parallel_list_parse = std::getenv("KVO_BENCH_NO_LIST_HELPER") == nullptr;
  // KVO_BENCH_LIST_HELPERS=N: the list helper's threads (default: the service's).
  if (const char* n = std::getenv("KVO_BENCH_LIST_HELPERS")) {
    so.list_helper_threads = static_cast<unsigned>(std::clamp(std::atoi(n), 1, 8));
  }
  // KVO_BENCH_NO_TAKEOVER=1: the handler always waits for a helper that stalls (the comparison
  // run; ServiceOptions::list_helper_patience_ns, key_helper_patience_ns).
  const bool takeover = std::getenv("KVO_BENCH_NO_TAKEOVER") == nullptr;
  if (!takeover) {
    so.list_helper_patience_ns = so.key_helper_patience_ns = std::numeric_limits<int64_t>::max();
  }
  // KVO_BENCH_TOKEN_SCAN=N: the token scanner at level N or the best below it (TokenScan: 0
  // portable, 1 AVX2, 2 AVX-512 element-aligned windows, 3 AVX-512 at a fixed stride).
  const char* scan_level = std::getenv("KVO_BENCH_TOKEN_SCAN");
  const TokenScan best_scan = SetTokenScan(TokenScan::kAvx512Stride);
  const TokenScan scan =
      scan_level == nullptr
          ? best_scan
          : std::min(best_scan, static_cast<TokenScan>(std::clamp(std::atoi(scan_level), 0, 3)));
  SetTokenScan(scan);
  auto started = IndexerService::Start(cfg, so);
  if (!started.ok()) {
    std::fprintf(stderr, "router bench: %s\n", started.status().ToString().c_str());
    return 1;
  }
  IndexerService& svc = **started;
  LoopbackHttp http(svc.http_port());
  if (!http.ok()) return 1;
  const size_t n_sources = 100;
  const size_t n_blocks = 8192;
  const size_t noise = o.quick ? 512 : 8192;
  // Endpoints nobody publishes on: the index is filled in process below (the same index the
  // stream threads would fill), so only the query path is measured.
  auto register_body = [](const std::string& id, int port) {
    return R"({"endpoint": "tcp://127.0.0.1:)" + std::to_string(port) +
           R"(", "type": "vLLM", "modelname": "bench", "instance_id": ")" + id +
           R"(", "block_size": 16, "dp_rank": 0})";
  };
  std::string answer;
  for (size_t i = 0; i < n_sources; ++i) {
    if (http.Post("/register",
                  register_body("engine-" + std::to_string(i), 40000 + static_cast<int>(i)),
                  &answer) != 200) {
      std::fprintf(stderr, "router bench: /register: %s\n", answer.c_str());
      return 1;
    }
  }
  uint64_t entries = 0;
  const ScoringSetup s =
      BuildScoring(svc.index(), n_sources, n_blocks, noise, &entries, "@default@0");
  nlohmann::json qh = {{"model", "bench"}, {"block_size", 16}, {"seq_hashes", s.hashes}};
  nlohmann::json qt = {{"model", "bench"}, {"block_size", 16}, {"token_ids", s.prompt}};
  const std::string body_hash = qh.dump();
  const std::string body_tokens = qt.dump();
  // The same query as Python's json.dumps writes it (", " and ": "): the parse alone, as a note.
  std::string body_spaced = R"({"model": "bench", "block_size": 16, "token_ids": [)";
  for (size_t i = 0; i < s.prompt.size(); ++i) {
    body_spaced += (i ? ", " : "") + std::to_string(s.prompt[i]);
  }
  body_spaced += "]}";
  // The answer is right: each instance's longest match is its held depth.
  int64_t wrong = 0;
  for (const std::string* body : {&body_hash, &body_tokens}) {
    const int st = http.Post(body == &body_hash ? "/query_by_hash" : "/query", *body, &answer);
    if (st != 200) {
      std::fprintf(stderr, "router bench: HTTP %d: %.200s\n", st, answer.c_str());
      return 1;
    }
    auto j = nlohmann::json::parse(answer)["default"];
    if (j.size() != n_sources) ++wrong;
    for (size_t i = 0; i < n_sources && j.size() == n_sources; ++i) {
      wrong +=
          j["engine-" + std::to_string(i)]["longest_matched"].get<int64_t>() != s.depth[i] * 16;
    }
  }
  const int iters = o.quick ? 20 : 300;
  // The two HTTP figures with a p99 target: 1,000 requests each, so their p99 is the 11th slowest
  // (of 300 it was the 4th, and a stall or two more or less decided a run).
  const int target_iters = o.quick ? 20 : 1000;
  auto time_http = [&](const char* path, const std::string& body, std::vector<double>* lat,
                       int want = 200, int n = 0) {
    for (int i = 0; i < (n > 0 ? n : iters); ++i) {
      const auto a = Clk::now();
      const int st = http.Post(path, body, &answer);
      lat->push_back(Seconds(a, Clk::now()) * 1e6);
      if (st != want) return false;
    }
    return true;
  };
  auto time_inproc = [&](const ScoreQuery& q, std::vector<double>* lat) {
    for (int i = 0; i < iters; ++i) {
      const auto a = Clk::now();
      auto r = svc.index().Tiered(q);
      lat->push_back(Seconds(a, Clk::now()) * 1e6);
      if (!r.ok() || r->size() != n_sources) return false;
    }
    return true;
  };
  ScoreQuery by_hash;
  by_hash.block_hashes = s.hashes;
  ScoreQuery by_tokens;
  by_tokens.token_ids = s.prompt;
  by_tokens.block_size = 16;
  // The service's handler called directly (parse + scope + walk + render, no socket): what the
  // HTTP figure spends outside the transport.
  auto time_handler = [&](const char* path, const std::string& body, std::vector<double>* lat) {
    HttpRequest req;
    req.method = "POST";
    req.path = path;
    for (int i = 0; i < iters; ++i) {
      req.body = body;  // the server hands the handler a body it owns; the copy is not timed
      const auto a = Clk::now();
      HttpResponse res = svc.Handle(req);
      lat->push_back(Seconds(a, Clk::now()) * 1e6);
      if (res.status != 200) return false;
    }
    return true;
  };
  // The body's parse alone (ParseRouterQuery: the list scanner, then the DOM for the rest).
  auto time_parse = [&](bool hashes, const std::string& body, std::vector<double>* lat) {
    for (int i = 0; i < iters; ++i) {
      const auto a = Clk::now();
      auto q = ParseRouterQuery(body, hashes, cfg.max_query_tokens);
      lat->push_back(Seconds(a, Clk::now()) * 1e6);
      if (!q.ok()) return false;
    }
    return true;
  };
  // The transport alone: the same body to a path no route serves (read, the worker hand-off, a
  // small 404 answer), same connection, so an HTTP figure splits into transport and handler.
  std::vector<double> h_http, t_http, h_in, t_in, h_handler, t_handler, h_parse, t_parse;
  std::vector<double> h_transport, t_transport;
  if (!time_http("/bench_no_such_route", body_hash, &h_transport, 404) ||
      !time_http("/bench_no_such_route", body_tokens, &t_transport, 404)) {
    return 1;
  }
  std::vector<double> t_parse_spaced;
  if (!time_parse(true, body_hash, &h_parse) || !time_parse(false, body_tokens, &t_parse) ||
      !time_parse(false, body_spaced, &t_parse_spaced) || !time_inproc(by_hash, &h_in) ||
      !time_handler("/query_by_hash", body_hash, &h_handler) ||
      !time_http("/query_by_hash", body_hash, &h_http, 200, target_iters) ||
      !time_inproc(by_tokens, &t_in) || !time_handler("/query", body_tokens, &t_handler)) {
    return 1;
  }
  // A metric's value in the service's Prometheus text (0 when absent).
  auto metric = [](const std::string& text, const std::string& key) {
    const size_t at = text.find("\n" + key + " ");
    return at == std::string::npos ? 0.0 : std::strtod(text.c_str() + at + key.size() + 2, nullptr);
  };
  // The handler's own time while served over HTTP (the service's score latency histogram around
  // the HTTP /query loop): against the handler called directly, what a worker thread woken by the
  // I/O thread spends more on the same work.
  const std::string before_http = svc.metrics().RenderPrometheus();
  const IndexerCounters walks_before = svc.index().Stats().counters;
  const int64_t faults_before = MinorFaults();
  const double steal_before = StealMs();
  const auto loop_start = Clk::now();
  if (!time_http("/query", body_tokens, &t_http, 200, target_iters)) return 1;
  const double loop_ms = Seconds(loop_start, Clk::now()) * 1e3;
  const double steal_ms = steal_before < 0 ? -1 : StealMs() - steal_before;
  const double faults_per_query =
      static_cast<double>(MinorFaults() - faults_before) / static_cast<double>(target_iters);
  const std::string metrics = svc.metrics().RenderPrometheus();
  // How the walks of the timed /query loop found their blocks (indexer/DESIGN.md "Chain hints").
  const IndexerCounters walks_after = svc.index().Stats().counters;
  const int64_t hinted = walks_after.walk_blocks_hinted - walks_before.walk_blocks_hinted;
  const int64_t looked_up = walks_after.walk_blocks_looked_up - walks_before.walk_blocks_looked_up;
  const double served_n = metric(metrics, "kvo_indexer_score_latency_seconds_count") -
                          metric(before_http, "kvo_indexer_score_latency_seconds_count");
  const double chunks_on_helper =
      served_n > 0 ? (metric(metrics, "kvo_indexer_query_list_chunks_on_helper_total") -
                      metric(before_http, "kvo_indexer_query_list_chunks_on_helper_total")) /
                         served_n
                   : 0.0;
  const double served_us = served_n > 0
                               ? (metric(metrics, "kvo_indexer_score_latency_seconds_sum") -
                                  metric(before_http, "kvo_indexer_score_latency_seconds_sum")) /
                                     served_n * 1e6
                               : 0.0;
  // Where /query's content keys were hashed (the service's counter): on the key helper while the
  // body was parsed, or in the walk.
  auto counter = [&](const char* by) {
    const std::string key = std::string("kvo_indexer_query_keys_total{by=\"") + by + "\"} ";
    const size_t at = metrics.find(key);
    return at == std::string::npos ? 0.0 : std::strtod(metrics.c_str() + at + key.size(), nullptr);
  };
  const double on_helper = counter("helper");
  const double in_walk = counter("walk");
  // A histogram's mean in microseconds (its _sum over its _count).
  auto mean_us = [&](const std::string& name) {
    const double n = metric(metrics, name + "_count");
    return n > 0 ? metric(metrics, name + "_sum") / n * 1e6 : 0.0;
  };
  // Helper work the handler took back during the timed loop (a helper that stalled).
  auto taken_back = [&](const char* helper) {
    const std::string key =
        std::string("kvo_indexer_query_helper_takeovers_total{helper=\"") + helper + "\"}";
    return metric(metrics, key) - metric(before_http, key);
  };
  // The handler's waits for the key helper after the list that took longer than 250 us (the
  // histogram's buckets): a helper that stalled, waited out, or (with takeover) given up.
  auto waits_over = [&](const std::string& text) {
    const std::string name = "kvo_indexer_query_helper_wait_seconds";
    const double all = metric(text, name + "_count");
    const std::string bucket = name + "_bucket{le=\"";
    double within = 0;
    for (size_t at = text.find(bucket); at != std::string::npos; at = text.find(bucket, at + 1)) {
      const double le = std::strtod(text.c_str() + at + bucket.size(), nullptr);
      const size_t value = text.find("} ", at);
      if (le <= 0.00025 && value != std::string::npos) {
        within = std::max(within, std::strtod(text.c_str() + value + 2, nullptr));
      }
    }
    return all - within;
  };
  const double long_waits = waits_over(metrics) - waits_over(before_http);
  const double list_takeovers = taken_back("list");
  const double key_takeovers = taken_back("keys");
  const double helper_start_us = mean_us("kvo_indexer_query_helper_start_seconds");
  const double helper_wait_us = mean_us("kvo_indexer_query_helper_wait_seconds");
  char notes[1400];
  for (int k = 0; k < 2; ++k) {
    const bool tokens = k == 1;
    for (double p : {50.0, 99.0}) {
      BenchResult r;
      r.area = "indexer";
      r.name =
          std::string(tokens ? "router_query_128k_tokens" : "router_query_by_hash_8192_blocks") +
          "_100_instances_http_" + (p == 50 ? "p50" : "p99");
      r.unit = "us";
      r.value = Percentile(tokens ? t_http : h_http, p);
      r.baseline_name = "in-process tiered walk (Indexer::Tiered), same index";
      r.baseline = Percentile(tokens ? t_in : h_in, p);
      std::snprintf(
          notes, sizeof notes,
          "POST %s over loopback keep-alive HTTP, request body %zu bytes, parse + scope "
          "+ walk + render; the handler alone (no socket) %.0f us, of which the body's "
          "parse %.0f us%s (token scan level %d); the transport alone (same body, a 404 path) "
          "%.0f us; %s; %s%lld wrong answers; lower is better%s",
          tokens ? "/query" : "/query_by_hash", (tokens ? body_tokens : body_hash).size(),
          Percentile(tokens ? t_handler : h_handler, p), Percentile(tokens ? t_parse : h_parse, p),
          tokens ? SpacedNote(body_spaced.size(), Percentile(t_parse_spaced, p)).c_str() : "",
          static_cast<int>(scan), Percentile(tokens ? t_transport : h_transport, p),
          !so.follow_query_bodies ? "the body read whole before a worker takes it"
          : tokens && so.parse_arriving_queries
              ? (chunks_on_helper > 0 ? "the token list parsed as the body arrives, in chunks "
                                        "by the handler and the list helper's " +
                                            std::to_string(svc.list_helper_threads()) + " thread(s)"
                                      : std::string("the token list parsed as the body arrives"))
                    .c_str()
              : "the body followed by a worker as it arrives",
          tokens ? KeysNote(so.parallel_query_keys, on_helper, in_walk, helper_start_us,
                            helper_wait_us, served_us)
                       .c_str()
                 : "",
          static_cast<long long>(wrong),
          p == 99 ? (P99Note(r.value, 1000) + SlowestNote(tokens ? t_http : h_http)).c_str() : "");
      r.notes = notes;
      if (tokens) {
        const std::string patience =
            !takeover
                ? "never: it waits for a stalled helper"
                : "after " + std::to_string(so.list_helper_patience_ns / 1000) + " / " +
                      std::to_string(so.key_helper_patience_ns / 1000) + " us without progress";
        char faults[700];
        std::snprintf(faults, sizeof faults,
                      "; minor page faults per request (whole process): %.1f; list chunks read "
                      "by the list helper per request: %.1f; CPU time stolen by the hypervisor "
                      "during the %.0f ms of the timed loop, all CPUs: %.0f ms; helper work the "
                      "handler took back (%s): %.0f list chunks, %.0f key jobs; the handler's "
                      "waits for the key helper over 250 us: %.0f; blocks the timed loop's walks "
                      "found through a chain hint: %lld, through the hash table: %lld",
                      faults_per_query, chunks_on_helper, loop_ms, steal_ms, patience.c_str(),
                      list_takeovers, key_takeovers, long_waits, static_cast<long long>(hinted),
                      static_cast<long long>(looked_up));
        r.notes += faults;
      }
      PrintResult(r, o);
    }
  }
  // The token list's parse at the scan level in use against the level below it, alternated
  // request by request in this run (the server idle: SetTokenScan is not for use while parsing).
  if (scan > TokenScan::kPortable) {
    const auto below = static_cast<TokenScan>(static_cast<int>(scan) - 1);
    std::vector<double> at_level, at_below;
    for (int i = 0; i < iters; ++i) {
      for (const bool lower : {false, true}) {
        SetTokenScan(lower ? below : scan);
        const auto a = Clk::now();
        auto q = ParseRouterQuery(body_tokens, false, cfg.max_query_tokens);
        (lower ? at_below : at_level).push_back(Seconds(a, Clk::now()) * 1e6);
        if (!q.ok() || q->token_ids != s.prompt) return 1;
      }
    }
    SetTokenScan(scan);
    for (double p : {50.0, 99.0}) {
      BenchResult r;
      r.area = "indexer";
      r.name = std::string("router_query_128k_tokens_parse_") + (p == 50 ? "p50" : "p99");
      r.unit = "us";
      r.value = Percentile(at_level, p);
      r.baseline_name = "the same parse one token scan level lower";
      r.baseline = Percentile(at_below, p);
      std::snprintf(notes, sizeof notes,
                    "ParseRouterQuery of the /query body (%zu bytes, 131072 token ids) at token "
                    "scan level %d against level %d (0 portable, 1 AVX2, 2 AVX-512 "
                    "element-aligned windows, 3 AVX-512 at a fixed stride), alternated; lower is "
                    "better",
                    body_tokens.size(), static_cast<int>(scan), static_cast<int>(below));
      r.notes = notes;
      PrintResult(r, o);
    }
  }
  // /register and /unregister of many sources, one request each (each starts / stops and joins a
  // stream thread; unregister also clears the source's entries). Baseline: GET /health on the
  // same connection (the server's round trip).
  const size_t n_reg = o.quick ? 50 : 1000;
  std::vector<double> reg, unreg, health;
  for (size_t i = 0; i < n_reg; ++i) {
    const auto a = Clk::now();
    const int st = http.Post(
        "/register", register_body("r-" + std::to_string(i), 41000 + static_cast<int>(i)), &answer);
    reg.push_back(Seconds(a, Clk::now()) * 1e6);
    if (st != 200) {
      std::fprintf(stderr, "router bench: /register: %s\n", answer.c_str());
      return 1;
    }
  }
  for (size_t i = 0; i < n_reg; ++i) {
    const auto a = Clk::now();
    const int st =
        http.Post("/unregister", R"({"instance_id": "r-)" + std::to_string(i) + R"("})", &answer);
    unreg.push_back(Seconds(a, Clk::now()) * 1e6);
    if (st != 200) {
      std::fprintf(stderr, "router bench: /unregister: %s\n", answer.c_str());
      return 1;
    }
  }
  for (size_t i = 0; i < 200; ++i) {
    const auto a = Clk::now();
    // GET as a POST-less request: the round trip of a trivial route.
    const int st = http.Post("/query_by_hash",
                             R"({"model": "bench", "block_size": 16, "seq_hashes": []})", &answer);
    health.push_back(Seconds(a, Clk::now()) * 1e6);
    if (st != 200) return 1;
  }
  for (int k = 0; k < 2; ++k) {
    const std::vector<double>& lat = k == 0 ? reg : unreg;
    for (double p : {50.0, 99.0}) {
      BenchResult r;
      r.area = "indexer";
      r.name = std::string(k == 0 ? "router_register" : "router_unregister") + "_" +
               std::to_string(n_reg) + "_sources_http_" + (p == 50 ? "p50" : "p99");
      r.unit = "us";
      r.value = Percentile(lat, p);
      r.baseline_name = "empty /query_by_hash round trip, same connection";
      r.baseline = Percentile(health, p);
      std::snprintf(notes, sizeof notes,
                    "one request per source (%s), %zu sources beside the 100 queried ones; lower "
                    "is better%s",
                    k == 0 ? "stored in SQLite, stream thread started"
                           : "stream thread joined, entries cleared, row deleted",
                    n_reg, p == 99 ? P99Note(r.value, 50'000).c_str() : "");
      r.notes = notes;
      PrintResult(r, o);
    }
  }
  svc.Stop();
  return wrong == 0 ? 0 : 1;
}
}  // namespace

int RunIndexerBench(const BenchOptions& options) {
  int rc = 0;
  if (options.Wants("ingest")) rc |= IngestCase(options);
  if (options.Wants("score")) rc |= ScoreCase(options);
  if (options.Wants("router")) rc |= RouterApiCase(options);
  return rc;
}

}  // namespace kvo::bench
