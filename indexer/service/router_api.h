// The Mooncake/Dynamo indexer HTTP API (RFC #1403, docs/router-api.md §1-2) as pure
// functions: parsing /register, /unregister, /query and /query_by_hash bodies, the tiered match
// of one stream, and rendering the answers. No sockets, no state; thread-safe (ListHelper, the
// one class with a thread, is handed to the /query parse by its owner). The service (service.cc)
// owns the registrations, the subscriptions and the helpers.
//
//   POST /register   {"endpoint", "replay_endpoint"?, "type", "modelname" | "model_name" |
//                     "model", "lora_name"?, "tenant_id"?, "instance_id", "block_size",
//                     "dp_rank", "additionalsalt"?, "dp_ranks"?, "topic"?}
//     -> {"status": "registered successfully", "instance_id"}
//     kvo's additions: "dp_ranks": N registers ranks dp_rank .. dp_rank+N-1 of a vLLM engine at
//     once (each rank's endpoints offset by its distance from dp_rank, vLLM's port rule; each rank
//     is its own registration "<id>|<tenant>|<rank>"); "topic": the SUB topic filter.
//   POST /unregister {"instance_id", "tenant_id"?, "dp_rank"?, ...}  (dp_rank omitted: every rank)
//     -> {"status": "unregistered successfully", "removed_instances": ["<id>|<tenant>|<rank>"]}
//   POST /query      {"model" | "model_name" | "modelname", "token_ids", "block_size",
//                     "lora_name"? | "lora_id"?, "tenant_id"?, "instance_id"?, "cache_salt"?}
//   POST /query_by_hash  the same with "seq_hashes" (or "block_hash") instead of "token_ids"
//     -> {tenant: {instance_id: {"longest_matched", "GPU", "DP": {rank: n}, "CPU", "DISK"}}}
//   errors -> {"error": "<what, naming the field>"} (400; 409 for a conflicting registration)
//
// Keys these routes do not know are ignored (the peers' clients send more than they read).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/mutex.h"
#include "common/result.h"
#include "indexer/indexer.h"
#include "indexer/service/http_api.h"

namespace kvo {

class ArrivingBody;  // http/http_server.h

// The publisher kinds of the API's "type". kvo decodes vLLM's event wire format; SGLang
// publishes the same format. Mooncake's own store events are not decoded (refused).
enum class EngineType { kVllm, kSglang };
std::string_view EngineTypeName(EngineType t);

// The API's media. vLLM's STORAGE is DISK here; other media names take no part. A copy a
// secondary tier owns (ownership "kvcr" on medium CPU) counts under its medium.
enum class RouterTier { kGpu, kCpu, kDisk, kOther };
RouterTier RouterTierOf(std::string_view medium);

struct Registration {
  std::string endpoint;
  std::optional<std::string> replay_endpoint;
  EngineType type = EngineType::kVllm;
  std::string model;
  std::string lora_name;  // "" = the base model
  std::string tenant_id = "default";
  std::string instance_id;
  int64_t block_size = 0;
  int64_t dp_rank = 0;
  std::string additional_salt;
  std::string topic;  // SUB topic filter ("" = every topic)
  // How many ranks this request registers (ExpandRanks); 1 in a stored registration.
  int64_t dp_ranks = 1;
  // Set for a registration made by --discover (the URL polled): resumed at start even off
  // loopback (the operator named the host), and followed when the engine moves.
  std::string discovered_from;

  // The index's source name for this registration: "<instance_id>@<tenant_id>@<dp_rank>".
  std::string SourceName() const;
  // The API's name of it: "<instance_id>|<tenant_id>|<dp_rank>".
  std::string Key() const;
};

// Parses and validates a /register body. Endpoints must be tcp:// or ipc://; a tcp:// host off
// loopback is refused unless allow_remote. InvalidArgument naming the field.
Result<Registration> ParseRegisterRequest(std::string_view body, bool allow_remote);
// The stored form (the index's `registrations.body`); ParseStoredRegistration reads it back.
std::string RenderRegistration(const Registration& r);
// A stored registration (RenderRegistration's form, which may carry "discovered_from").
Result<Registration> ParseStoredRegistration(std::string_view body, bool allow_remote);
// One registration per rank of a "dp_ranks": N request: rank dp_rank + i listens on the
// endpoint ports + i (vLLM's offset_endpoint_port from the given rank's ports). InvalidArgument
// when a port would pass 65535.
Result<std::vector<Registration>> ExpandRanks(const Registration& r);
// Names the first field of the subscription or its scoping in which two registrations of one key
// differ ("" when they are the same subscription). `discovered_from` (who registered it) is not
// compared: /register of a discovered instance with the same body is a no-op, and discovery
// finding an instance a router registered leaves it alone.
std::string FirstDifference(const Registration& a, const Registration& b);

struct UnregisterRequest {
  std::string instance_id;
  std::string tenant_id = "default";
  std::optional<int64_t> dp_rank;  // none: every rank of the instance
};
Result<UnregisterRequest> ParseUnregisterRequest(std::string_view body);

struct RouterQuery {
  std::string model;
  std::string lora_name;  // "" = base model
  std::string tenant_id = "default";
  std::optional<std::string> instance_id;
  int64_t block_size = 0;
  std::string cache_salt;
  std::vector<int64_t> token_ids;  // /query
  std::vector<uint64_t> hashes;    // /query_by_hash
};
// Receives a /query body's token ids while the list scanner reads them, so that work on them (the
// content keys, KeyHelper) overlaps the rest of the parse. Calls, all from the parsing thread:
// Begin once the rest of the body has parsed (its block size, positive, its LoRA name, and how
// many tokens the list can hold at most: its bytes and max_items bound it), then
// Tokens as the list grows (tokens [0, n) of `data` are final; `data` stays where it is until
// End), then End(ok): ok when those tokens are the answer's token_ids (ParseRouterQuery then
// returns them in RouterQuery::token_ids, whose storage is `data`: a sink that still reads them
// after End(true), a KeyHelper lease that gave its job up, relies on that); not ok when the
// scanner gave up on the list or the rest of the body disagrees (the DOM reads the body instead).
// No call at all when the body's other fields do not parse or the list is not compact integers.
class TokenSink {
 public:
  virtual ~TokenSink() = default;
  virtual void Begin(int64_t block_size, std::string_view lora_name, size_t max_tokens) = 0;
  virtual void Tokens(const int64_t* data, size_t n) = 0;
  virtual void End(bool ok) = 0;
};

// A thread that parses part of a long /query token list while the handler parses the rest (the
// parse is the longest step of a 128k-token /query on a slow core: ~350 us for 820 kB). The list's
// bytes are cut into chunks; the handler and the helper each take the next chunk nobody has
// taken, read its elements (those whose first digit lies in it) into a buffer of the chunk's own,
// and the handler joins the chunks in order, feeding the sink as each joins. A chunk joins only
// where the last one stopped (its first element is where the sequential scanner would be), so
// the answer is the sequential parse's; at anything a chunk cannot take (a defect, a number
// that is not compact, the item limit, the list's end) the handler reads on sequentially from
// there. One query at a time holds it (TryLease); the others parse alone.
//
// A helper that stalls (its thread descheduled: a host that steals CPU time, a busy machine) does
// not hold the query up: when the handler has joined every chunk before one the helper took, that
// chunk's bytes are in, and the helper has not finished it `takeover_after_ns` later, the handler
// reads it itself into a buffer of its own and joins that instead. The lease, not the parse, waits
// for the thread to leave the job: its holder keeps the body alive and drops the lease once the
// answer is out (HttpResponse::after_sent).
class ListHelper {
 public:
  struct Options {
    size_t chunk_bytes = 32u << 10;      // at least this much list per chunk
    size_t max_chunks = 64;              // longer lists: longer chunks
    size_t min_list_bytes = 192u << 10;  // shorter bodies are parsed by the handler alone
    size_t max_list_bytes = 16u << 20;   // and longer ones too (the chunks' buffers stay bounded)
    // Threads reading chunks beside the handler (each takes the next chunk nobody took).
    size_t threads = 1;
    // A chunk the helper has not finished this long after its bytes came (and the handler has
    // joined every chunk before it) is read by the handler, on `clock` (the default: never; the
    // service's is ServiceOptions::list_helper_patience_ns; a chunk takes ~10 us on a 16-core
    // host).
    int64_t takeover_after_ns = std::numeric_limits<int64_t>::max();
    Clock* clock = SystemClock();
    // Tests: run on the helper's thread before it reads a chunk it took (to stall it there).
    std::function<void(size_t chunk)> before_chunk;
  };
  struct Job;  // router_api.cc
  class Lease {
   public:
    // Waits for the helper's thread to leave this lease's job (the body and the handler's
    // buffers must live until then), then gives the helper back.
    ~Lease();
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ListHelper* helper() const { return helper_; }
    // For ParseRouterQuery: the job of this lease's one parse (nullptr once it has one).
    Job* NewJob();
    // Chunks the handler read itself because the helper had stalled on them.
    size_t takeovers() const;
    // Chunks of this lease's list the helper read and the handler joined.
    size_t joined_from_helper() const;

   private:
    friend class ListHelper;
    explicit Lease(ListHelper* h);
    ListHelper* const helper_;
    std::unique_ptr<Job> job_;
  };

  explicit ListHelper(Options options);
  ~ListHelper();  // stops and joins the threads (no lease may be held)
  ListHelper(const ListHelper&) = delete;
  ListHelper& operator=(const ListHelper&) = delete;

  // The helper for one query's parse, or nullptr while another query holds it.
  std::unique_ptr<Lease> TryLease();
  const Options& options() const { return options_; }
  // Chunks the helper threads parsed, so far (tests).
  uint64_t chunks_by_helper() const { return chunks_by_helper_.load(std::memory_order_relaxed); }

  // For ParseRouterQuery (the lease holder): hands `job` to the threads (the lease's destructor
  // waits for every thread to leave it).
  void Post(Job* job);
  // The lease holder's buffer for chunk i (reused query after query).
  std::vector<int64_t>* Buffer(size_t i);

 private:
  void Run();
  // Returns once every thread that took `job` has left it; no thread takes it afterwards.
  void Retire(Job* job);

  const Options options_;
  std::atomic<bool> leased_{false};
  std::atomic<uint64_t> chunks_by_helper_{0};
  std::vector<std::vector<int64_t>> buffers_;  // the lease holder's
  Mutex mu_;
  CondVar cv_{&mu_};
  // One job at a time (one lease): posted until retired; each thread takes it once (by its
  // generation) and is counted in `working_` while in it.
  Job* posted_ GUARDED_BY(mu_) = nullptr;
  uint64_t posted_generation_ GUARDED_BY(mu_) = 0;
  size_t working_ GUARDED_BY(mu_) = 0;
  bool stop_ GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

// by_hash: /query_by_hash ("seq_hashes" or "block_hash"), else /query ("token_ids"). A list
// longer than max_items is a 400 (checked on the text before the DOM is built). `sink` (optional,
// /query only): fed the token ids as they are read.
Result<RouterQuery> ParseRouterQuery(std::string_view body, bool by_hash, int64_t max_items,
                                     TokenSink* sink = nullptr);
// /query on a body still arriving (HttpServerOptions::arriving_paths): the same answer as the
// above on the whole body, but the members before "token_ids" are read (and the sink begun) from
// its first piece and the list's compact ids as each piece lands, so the parse ends with the
// transfer. A body that never completes: InvalidArgument (the server drops the answer).
// `lists` (optional): a second thread that parses part of a long token list (ListHelper), for
// this one parse; `body` must outlive the lease.
Result<RouterQuery> ParseRouterQuery(const ArrivingBody& body, int64_t max_items,
                                     TokenSink* sink = nullptr, ListHelper::Lease* lists = nullptr);
// The same without the list scanner (the whole body through the JSON DOM): the reference the
// scanner must agree with (router_api_test, router_query_fuzz).
Result<RouterQuery> ParseRouterQueryReference(std::string_view body, bool by_hash,
                                              int64_t max_items);
// How the token scanner converts whole 64-byte windows of compact token ids: the best the CPU
// has, checked at run time (AVX-512 VBMI2: the window in registers; AVX2: four elements at a
// time; else the portable code; kAvx512Stride: AVX-512 windows at a fixed stride, so that one
// window's load does not wait on the last one's masks).
enum class TokenScan { kPortable = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Stride = 3 };
// For tests and benchmarks: use `wanted` or the best the CPU has below it; returns the best the
// CPU has. Not for concurrent use with parsing.
TokenScan SetTokenScan(TokenScan wanted);

// One stream's tiered match, in blocks: its GPU prefix, then (from the first GPU miss) blocks
// held on GPU or CPU, then blocks held on any of GPU, CPU, DISK.
struct TierBoundaries {
  int64_t gpu = 0;
  int64_t cpu = 0;   // >= gpu
  int64_t disk = 0;  // >= cpu: the stream's longest match
};
TierBoundaries MatchTiers(const std::vector<ExplainBlock>& blocks, std::string_view source,
                          int64_t dp_rank);

// One instance's totals over its ranks, in tokens.
struct InstanceTotals {
  int64_t longest_matched = 0;
  int64_t gpu = 0;
  int64_t cpu = 0;
  int64_t disk = 0;
};
// One instance's answer, in tokens.
struct InstanceMatch : InstanceTotals {
  std::map<int64_t, int64_t> dp;  // rank -> matched tokens
};
// Folds one rank's boundaries into its instance: "GPU" is the GPU prefix; "CPU" / "DISK" the
// cumulative boundary reached once that medium is consumed, 0 when it adds nothing; over ranks,
// the largest of each.
void AddRank(const TierBoundaries& b, int64_t dp_rank, int64_t block_size, InstanceMatch* m);

// {tenant: {instance_id: {...}}}
std::string RenderRouterQueryResponse(const std::string& tenant,
                                      const std::map<std::string, InstanceMatch>& instances);

// The shape of a /query answer for one scope, built once and reused while the registry does not
// change (the service caches it), so a query folds numbers instead of building a map of
// instances, a map of ranks per instance and a copy of every name (~110 us of a 128k-token
// /query on a slow 16-core host). Folding and rendering through a plan give exactly the bytes of
// AddRank over the same streams and RenderRouterQueryResponse (RouterApiTest's
// PlannedAnswerEqualsTheMapFold).
struct ScopedStream {
  std::string instance_id;
  std::string source;
  int64_t dp_rank = 0;
};
struct RouterAnswerPlan {
  struct Instance {
    std::string id;
    std::vector<int64_t> ranks;  // sorted, unique; their matches are dp[first_slot...]
    size_t first_slot = 0;
  };
  struct Stream {
    std::string source;
    int64_t dp_rank = 0;
    uint32_t instance = 0;  // into instances
    uint32_t slot = 0;      // into RouterAnswer::dp
  };
  std::vector<Instance> instances;  // sorted by id: the response's order
  std::vector<Stream> streams;      // sorted by (source, dp_rank), unique
  size_t slots = 0;                 // ranks over all instances
};
// The plan for these streams in scope (any order; a (source, rank) listed twice counts once).
RouterAnswerPlan PlanRouterAnswer(std::vector<ScopedStream> streams);

// One query's answer under a plan: per instance, then per rank slot, in tokens.
struct RouterAnswer {
  explicit RouterAnswer(const RouterAnswerPlan& plan)
      : instances(plan.instances.size()), dp(plan.slots, 0) {}
  std::vector<InstanceTotals> instances;
  std::vector<int64_t> dp;
};
// Folds one stream's boundaries in as AddRank does; a stream not in the plan's scope is ignored.
void FoldStream(const RouterAnswerPlan& plan, std::string_view source, int64_t dp_rank,
                const TierBoundaries& b, int64_t block_size, RouterAnswer* answer);
// The bytes RenderRouterQueryResponse writes for the same instances.
std::string RenderRouterAnswer(const std::string& tenant, const RouterAnswerPlan& plan,
                               const RouterAnswer& answer);
// The same through a JSON tree (nlohmann's ordered_json): the reference the direct writer above
// must equal byte for byte (router_api_test).
std::string RenderRouterQueryResponseTree(const std::string& tenant,
                                          const std::map<std::string, InstanceMatch>& instances);

// {"status": "registered successfully", "instance_id": id}
std::string RenderRegistered(const std::string& instance_id);
// {"status": "unregistered successfully", "removed_instances": [...]}
std::string RenderUnregistered(const std::vector<std::string>& removed);

// GET /workers: {"workers": [{"instance_id", "tenant_id", "dp_rank", "endpoint",
// "replay_endpoint", "type", "model_name", "lora_name", "block_size", "source", "registered",
// "state", "last_sequence"}]}; a --source/--config stream appears with its source name as
// instance_id (tenant "default", no model).
struct WorkerInfo {
  Registration reg;
  std::string source;
  bool registered = false;
  StreamPhase state = StreamPhase::kConnecting;
  std::optional<uint64_t> last_sequence;
};
std::string RenderWorkers(const std::vector<WorkerInfo>& workers);

}  // namespace kvo
