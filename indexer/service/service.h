// The indexer daemon (`kvo index serve`): one subscriber thread per source stream (source x DP
// rank) applying batches to the Indexer in sequence order, a hash parity doctor per source, and
// the HTTP API (/v1/score, /v1/explain, /v1/sources, /metrics, /healthz).
//
// Per stream:
//   connecting --Create ok--> following <--batches/replay answers--> silent (nothing for
//   silent_after_ms: reported, the subscriber keeps probing)
//   connecting --Create fails--> retrying (exponential backoff) --> connecting
// The subscriber starts at LastSequence(source, rank) + 1 (the durable checkpoint), or replays
// everything the publisher still has for a stream the index does not know.
//
// Losses: a publisher restart, or batches that replay could not supply (replay window exceeded,
// no replay endpoint), make the stream's entries stale: that stream is cleared (ClearStream) and
// rebuilt from what follows; its sibling ranks keep their entries and carry on. A stream that
// holds nothing (no checkpoint) never clears. Malformed messages and batches that do not decode
// are counted, logged with the source name and skipped; the source is kept.
//
// Locking: a stream's thread alone applies and clears that stream (the Indexer is thread-safe);
// each stream's status has its own mutex; HTTP handlers read statuses and call the Indexer's
// thread-safe readers.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/metrics.h"
#include "common/result.h"
#include "http/http_server.h"
#include "indexer/indexer.h"
#include "indexer/service/http_api.h"
#include "indexer/service/sources_config.h"

namespace kvo {

struct ServiceOptions {
  IndexerOptions index;            // the database path comes from IndexerConfig::db
  Clock* clock = nullptr;          // SystemClock() when null
  bool start_http = true;          // off: use Handle() directly (tests)
  bool allow_remote_http = false;  // listening beyond loopback needs this (and warns)
  // POST /register of a tcp:// endpoint off loopback needs this (the API would otherwise make
  // the daemon connect anywhere).
  bool allow_remote_sources = false;
  // POST /query hashes the prompt's content keys on a helper thread while its token list is
  // parsed (KeyHelper), where the machine has more than one CPU.
  bool parallel_query_keys = true;
  // A worker follows a large query body while it arrives and runs the handler once it is complete
  // (HttpServerOptions::early_paths: /query, /query_by_hash, /v1/score).
  bool follow_query_bodies = true;
  // With follow_query_bodies: how many large bodies are followed at once (each holds one of the
  // HTTP server's 4 workers while it arrives; HttpServerOptions::max_early_requests). Others are
  // read whole first. 0: none.
  int max_early_requests = 1;
  // With follow_query_bodies: POST /query's handler parses the token list while it arrives
  // (HttpServerOptions::arriving_paths, ParseRouterQuery on an ArrivingBody) instead of after.
  bool parse_arriving_queries = true;
  // With parse_arriving_queries, on a machine of list_helper_min_cpus CPUs or more: a long token
  // list (192 kB or more) is parsed in chunks by the handler and a helper thread together
  // (ListHelper).
  bool parallel_list_parse = true;
  unsigned list_helper_min_cpus = 8;  // tests: 1
  // The list helper's threads beside the handler; 0: three on 16 CPUs or more, else one
  // (measured on a 16-core host: indexer/DESIGN.md; the bench's KVO_BENCH_LIST_HELPERS=N).
  unsigned list_helper_threads = 0;
  // How long a /query waits for a helper thread that makes no progress before doing the helper's
  // part itself; the helper's leftovers are waited for once the answer is out. Each is about what
  // the part costs the handler (a list chunk: ~10 us; the keys the helper had not hashed and the
  // walk: ~100-200 us on a 16-core host), so a stall costs at most about twice the better
  // choice, never the stall's milliseconds. INT64_MAX: always wait (the bench's comparison).
  int64_t list_helper_patience_ns = 100'000;  // ListHelper::Options::takeover_after_ns
  int64_t key_helper_patience_ns = 150'000;   // KeyHelper::Options::give_up_after_ns
};

class IndexerService {
 public:
  // Opens the index (refusing a corrupt or foreign file), starts one thread per stream and the
  // HTTP server; returns once the server listens.
  static Result<std::unique_ptr<IndexerService>> Start(const IndexerConfig& config,
                                                       const ServiceOptions& options = {});
  ~IndexerService();
  IndexerService(const IndexerService&) = delete;
  IndexerService& operator=(const IndexerService&) = delete;

  // Stops the HTTP server and the stream threads, then flushes the index (checkpoint durable).
  // Idempotent.
  void Stop();

  int http_port() const;  // 0 without HTTP
  // Threads of the /query list helper (0: none on this machine or with these options).
  size_t list_helper_threads() const;
  // Serves one request (what the HTTP server calls).
  HttpResponse Handle(const HttpRequest& request);

  std::vector<SourceStatus> Sources() const;
  Indexer& index();
  MetricsRegistry& metrics();

 private:
  struct Impl;
  explicit IndexerService(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvo
