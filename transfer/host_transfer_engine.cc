// The host engine: memcpy on an Executor. A job is cut into pieces of roughly equal bytes (at
// least min_split_bytes, at most one per worker) that run in parallel; results are reported in
// submission order per direction (transfer/job.h's InOrderJobQueue, one lane per direction).
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "common/clock.h"
#include "common/mutex.h"
#include "common/thread_pool.h"
#include "transfer/transfer_engine.h"

namespace kvo {
namespace {

constexpr uint64_t kStreamJobBytes = 8ull << 20;
constexpr uint64_t kStreamSegmentBytes = 4096;

#if defined(__SSE2__)
// memcpy with non-temporal 16-byte stores for the aligned middle.
void CopyStreaming(uint8_t* dst, const uint8_t* src, uint64_t n) {
  const uint64_t head = (16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & 15;
  if (head > 0) {
    std::memcpy(dst, src, head);
    dst += head;
    src += head;
    n -= head;
  }
  while (n >= 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 48), d);
    dst += 64;
    src += 64;
    n -= 64;
  }
  if (n > 0) std::memcpy(dst, src, n);
}
// Orders the streamed stores before the job is published as done.
void StreamFence() { _mm_sfence(); }
#else
void CopyStreaming(uint8_t* dst, const uint8_t* src, uint64_t n) { std::memcpy(dst, src, n); }
void StreamFence() {}
#endif

struct HostJob {
  JobId id = 0;
  TransferDirection direction = TransferDirection::kGpuToCpu;
  std::vector<CopySegment> segments;
  uint64_t bytes = 0;
  std::atomic<int> pieces_left{0};
  std::atomic<bool> started{false};
  int64_t start_ns = 0;  // written once by the first piece (guarded by `started`)
  int64_t end_ns = 0;
  bool done = false;  // guarded by the engine's mutex
};

class HostTransferEngine final : public TransferEngine {
 public:
  explicit HostTransferEngine(const TransferEngineOptions& options)
      : clock_(options.clock != nullptr ? options.clock : SystemClock()),
        num_workers_(std::max(1, options.num_threads)),
        min_split_bytes_(std::max<uint64_t>(options.min_split_bytes, 4096)) {
    if (options.executor != nullptr) {
      executor_ = options.executor;
    } else {
      owned_pool_ = std::make_unique<ThreadPool>(num_workers_, "kvo-xfer");
      executor_ = owned_pool_.get();
    }
  }

  ~HostTransferEngine() override {
    Drain();
    owned_pool_.reset();
    for (void* p : allocations_) std::free(p);
  }

  std::string_view name() const override { return "host"; }

  Result<HostRegion> AllocateHostRegion(uint64_t num_slots, uint64_t row_stride) override {
    uint64_t bytes = 0;
    if (num_slots == 0 || row_stride == 0 ||
        __builtin_mul_overflow(num_slots, row_stride, &bytes)) {
      return Status::InvalidArgument("host region: " + std::to_string(num_slots) + " slots of " +
                                     std::to_string(row_stride) + " bytes");
    }
    const uint64_t rounded = (bytes + 4095) / 4096 * 4096;
    void* p = std::aligned_alloc(4096, rounded);
    if (p == nullptr) {
      return Status::OutOfSpace("host region: cannot allocate " + std::to_string(rounded) +
                                " bytes");
    }
    std::memset(p, 0, rounded);  // pre-fault, like vLLM's MADV_POPULATE_WRITE
    MutexLock lock(&mu_);
    allocations_.push_back(p);
    return HostRegion{reinterpret_cast<uintptr_t>(p), num_slots, row_stride};
  }

  Status RegisterLayout(const KvLayout& layout, const HostRegion& region) override {
    KVO_RETURN_IF_ERROR(layout.CheckHostRegion(region));
    MutexLock lock(&mu_);
    if (layout_ != nullptr) return Status::FailedPrecondition("kv layout already registered");
    layout_ = std::make_unique<KvLayout>(layout);
    region_ = region;
    return Status::Ok();
  }

  Result<JobId> Submit(TransferRequest request) override {
    auto job = std::make_shared<HostJob>();
    job->direction = request.direction;
    if (request.blocks.has_value()) {
      if (!request.segments.empty()) {
        return Status::InvalidArgument("transfer job: both segments and a block spec given");
      }
      const KvLayout* layout;
      HostRegion region;
      {
        MutexLock lock(&mu_);
        layout = layout_.get();
        region = region_;
      }
      if (layout == nullptr) {
        return Status::FailedPrecondition("transfer job: block spec before RegisterLayout");
      }
      KVO_RETURN_IF_ERROR(layout->ExpandBlockSpec(*request.blocks, region, request.direction,
                                                  /*coalesce=*/true, &job->segments));
    } else {
      KVO_RETURN_IF_ERROR(ValidateSegments(request.segments, 1));
      job->segments = std::move(request.segments);
    }
    if (job->segments.empty()) return Status::InvalidArgument("transfer job: nothing to copy");
    for (const CopySegment& s : job->segments) job->bytes += s.bytes;

    // Cut into pieces: [segment index, offset) ranges of about `piece` bytes each.
    const uint64_t piece =
        std::max<uint64_t>(min_split_bytes_, (job->bytes + num_workers_ - 1) / num_workers_);
    std::vector<std::vector<CopySegment>> pieces(1);
    uint64_t in_piece = 0;
    for (CopySegment s : job->segments) {
      while (s.bytes > 0) {
        if (in_piece >= piece) {
          pieces.emplace_back();
          in_piece = 0;
        }
        const uint64_t take = std::min(s.bytes, piece - in_piece);
        pieces.back().push_back({s.src, s.dst, take});
        s.src += take;
        s.dst += take;
        s.bytes -= take;
        in_piece += take;
      }
    }
    job->pieces_left.store(static_cast<int>(pieces.size()));
    {
      MutexLock lock(&mu_);
      job->id = next_id_++;
      queue_.Push(static_cast<size_t>(job->direction), job);
    }
    const JobId id = job->id;
    for (auto& p : pieces) {
      executor_->Schedule([this, job, segs = std::move(p)] { RunPiece(*job, segs); });
    }
    return id;
  }

  void TakeFinished(std::vector<TransferResult>* out) override {
    MutexLock lock(&mu_);
    queue_.TakeFinished(IsDone, [out](const std::shared_ptr<HostJob>& job) {
      const HostJob& j = *job;
      TransferResult r;
      r.job_id = j.id;
      r.direction = j.direction;
      r.success = true;
      r.bytes = j.bytes;
      r.seconds = static_cast<double>(j.end_ns - j.start_ns) / 1e9;
      out->push_back(std::move(r));
    });
  }

  Status Wait(JobId id) override {
    MutexLock lock(&mu_);
    while (true) {
      const std::optional<bool> done = queue_.FinishedThrough(id, IsDone);
      if (!done.has_value()) {
        return Status::NotFound("transfer job " + std::to_string(id) +
                                " unknown or already returned by TakeFinished");
      }
      if (*done) return Status::Ok();
      done_cv_.Wait();
    }
  }

  void Drain() override {
    MutexLock lock(&mu_);
    while (!queue_.AllFinished(IsDone)) done_cv_.Wait();
  }

 private:
  // Called under mu_ (HostJob::done is guarded by it).
  static bool IsDone(const HostJob& job) { return job.done; }

  void RunPiece(HostJob& job, const std::vector<CopySegment>& segs) {
    if (!job.started.exchange(true)) job.start_ns = clock_->MonotonicNanos();
    // Many mid-sized segments adding up to more than the caches hold: stream the stores (what
    // memcpy does for one large copy) so destination lines are not read first.
    const bool stream = job.bytes >= kStreamJobBytes;
    for (const CopySegment& s : segs) {
      if (stream && s.bytes >= kStreamSegmentBytes) {
        CopyStreaming(reinterpret_cast<uint8_t*>(s.dst), reinterpret_cast<const uint8_t*>(s.src),
                      s.bytes);
      } else {
        std::memcpy(reinterpret_cast<void*>(s.dst), reinterpret_cast<const void*>(s.src), s.bytes);
      }
    }
    if (stream) StreamFence();
    if (job.pieces_left.fetch_sub(1) == 1) {
      const int64_t end = clock_->MonotonicNanos();
      MutexLock lock(&mu_);
      job.end_ns = std::max(end, job.start_ns);
      job.done = true;
      done_cv_.SignalAll();
    }
  }

  Clock* const clock_;
  const int num_workers_;
  const uint64_t min_split_bytes_;
  std::unique_ptr<ThreadPool> owned_pool_;
  Executor* executor_ = nullptr;

  Mutex mu_;
  CondVar done_cv_{&mu_};
  std::unique_ptr<KvLayout> layout_ GUARDED_BY(mu_);
  HostRegion region_ GUARDED_BY(mu_);
  JobId next_id_ GUARDED_BY(mu_) = 1;
  InOrderJobQueue<HostJob, 2> queue_ GUARDED_BY(mu_);  // one lane per TransferDirection
  std::vector<void*> allocations_ GUARDED_BY(mu_);
};

struct Registry {
  Mutex mu;
  std::map<std::string, TransferEngineFactory, std::less<>> factories GUARDED_BY(mu);
};

Registry& GetRegistry() {
  static Registry* r = [] {
    auto* reg = new Registry;
    MutexLock lock(&reg->mu);
    reg->factories["host"] = [](const TransferEngineOptions& o) {
      return MakeHostTransferEngine(o);
    };
    return reg;
  }();
  return *r;
}

}  // namespace

Result<std::unique_ptr<TransferEngine>> MakeHostTransferEngine(
    const TransferEngineOptions& options) {
  return std::unique_ptr<TransferEngine>(new HostTransferEngine(options));
}

Status RegisterTransferEngine(std::string name, TransferEngineFactory factory) {
  if (name.empty() || !factory) return Status::InvalidArgument("transfer engine: empty name");
  Registry& r = GetRegistry();
  MutexLock lock(&r.mu);
  if (r.factories.count(name) != 0) {
    return Status::AlreadyExists("transfer engine '" + name + "' already registered");
  }
  r.factories[std::move(name)] = std::move(factory);
  return Status::Ok();
}

Result<std::unique_ptr<TransferEngine>> MakeTransferEngine(std::string_view name,
                                                           const TransferEngineOptions& options) {
  TransferEngineFactory factory;
  {
    Registry& r = GetRegistry();
    MutexLock lock(&r.mu);
    auto it = r.factories.find(name);
    if (it != r.factories.end()) factory = it->second;
  }
  if (!factory) {
    std::string known;
    for (const auto& n : RegisteredTransferEngines()) known += (known.empty() ? "" : ", ") + n;
    return Status::NotFound("transfer engine '" + std::string(name) +
                            "' not registered (have: " + known + ")");
  }
  return factory(options);
}

std::vector<std::string> RegisteredTransferEngines() {
  Registry& r = GetRegistry();
  MutexLock lock(&r.mu);
  std::vector<std::string> names;
  for (const auto& [n, f] : r.factories) names.push_back(n);
  return names;
}

}  // namespace kvo
