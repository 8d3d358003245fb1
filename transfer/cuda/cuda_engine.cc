// The CUDA TransferEngine. See DESIGN.md in this folder for streams, ordering and method choice.
#include "transfer/cuda/cuda_engine.h"

#include <algorithm>
#include <array>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/logging.h"
#include "common/mutex.h"
#include "transfer/cuda/cuda_internal.h"
#include "transfer/job.h"
#include "transfer/staging_plan.h"

namespace kvo::cuda {

using cuda_internal::CopyDesc;
using cuda_internal::CudaStatus;

namespace {

cudaStream_t AsStream(uintptr_t h) { return reinterpret_cast<cudaStream_t>(h); }

// A copy the copy engines do (staging runs, batch, dma). Addresses as integers.
struct DmaCopy {
  uintptr_t dst;
  uintptr_t src;
  uint64_t bytes;
};

// Kernel descriptors: pinned, mapped host memory (the zero-copy kernel reads it directly) plus a
// device copy (staging uploads its descriptors once per job, so its short CTAs never wait on a
// PCIe round trip). Blocks are reused after their job finished.
struct PinnedBlock {
  CopyDesc* host = nullptr;
  CopyDesc* mapped = nullptr;  // device-usable address of `host`
  CopyDesc* device = nullptr;  // device memory of the same capacity
  size_t capacity = 0;         // descriptors
};

class DescriptorPool {
 public:
  ~DescriptorPool() {
    for (auto& b : free_) Free(b);
  }
  Result<PinnedBlock> Acquire(size_t count) {
    for (size_t i = 0; i < free_.size(); ++i) {
      if (free_[i].capacity >= count) {
        PinnedBlock b = free_[i];
        free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(i));
        return b;
      }
    }
    size_t capacity = 1024;
    while (capacity < count) capacity *= 2;
    PinnedBlock b;
    b.capacity = capacity;
    void* p = nullptr;
    KVO_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&p, capacity * sizeof(CopyDesc),
                                           cudaHostAllocMapped | cudaHostAllocPortable));
    b.host = static_cast<CopyDesc*>(p);
    void* d = nullptr;
    cudaError_t err = cudaHostGetDevicePointer(&d, p, 0);
    if (err == cudaSuccess) {
      b.mapped = static_cast<CopyDesc*>(d);
      err = cudaMalloc(&d, capacity * sizeof(CopyDesc));
      if (err == cudaSuccess) b.device = static_cast<CopyDesc*>(d);
    }
    if (err != cudaSuccess) {
      Free(b);
      return CudaStatus(err, "descriptor buffers");
    }
    return b;
  }
  void Release(PinnedBlock b) {
    if (b.host == nullptr) return;
    if (free_.size() >= 16) {
      Free(b);
      return;
    }
    free_.push_back(b);
  }

 private:
  static void Free(const PinnedBlock& b) {
    if (b.host) cudaFreeHost(b.host);
    if (b.device) cudaFree(b.device);
  }
  std::vector<PinnedBlock> free_;
};

struct Job {
  JobId id = 0;
  TransferDirection direction = TransferDirection::kGpuToCpu;
  CopyMethod method = CopyMethod::kAuto;
  bool busy = false;  // the compute stream had queued work at Submit
  uint64_t bytes = 0;
  cudaEvent_t start = nullptr;
  cudaEvent_t end = nullptr;
  Status status;  // an enqueue error: the job fails without waiting for its events
  PinnedBlock descs;
  // cudaMemcpyBatchAsync argument arrays, alive until the job finished.
  std::deque<std::vector<void*>> batch_ptrs;
  std::deque<std::vector<size_t>> batch_sizes;
};

struct Lane {
  cudaStream_t copy = nullptr;    // copy-engine work (DMA, batch)
  cudaStream_t kernel = nullptr;  // gather/scatter kernels, high priority
  std::array<void*, 2> staging{};
  std::array<cudaEvent_t, 2> slot_ready{};  // staging slot filled (by gather or DMA)
  std::array<cudaEvent_t, 2> slot_free{};   // staging slot drained
  uint64_t next_slot = 0;
  cudaEvent_t tail = nullptr;  // end of the direction's last job (in-order completion)
};

// A host range whose device-usable address is known (pinned by us or registered).
struct PinnedRange {
  uintptr_t base;
  uint64_t bytes;
  uintptr_t device;
  enum class Ownership { kNone, kAllocated, kRegistered };
  Ownership ownership;  // what the destructor undoes: nothing, cudaFreeHost, cudaHostUnregister
};
using Ownership = PinnedRange::Ownership;

class CudaTransferEngine final : public TransferEngine {
 public:
  CudaTransferEngine(const TransferEngineOptions& options, const CudaEngineTuning& tuning,
                     CopyMethod method)
      : device_(options.device),
        compute_(AsStream(options.compute_stream)),
        tuning_(tuning),
        method_(method) {}

  ~CudaTransferEngine() override {
    cudaSetDevice(device_);
    for (Lane& lane : lanes_) {
      if (lane.copy) cudaStreamSynchronize(lane.copy);
      if (lane.kernel) cudaStreamSynchronize(lane.kernel);
    }
    for (Lane& lane : lanes_) {
      for (void* s : lane.staging) {
        if (s) cudaFree(s);
      }
      for (cudaEvent_t e : lane.slot_ready) {
        if (e) cudaEventDestroy(e);
      }
      for (cudaEvent_t e : lane.slot_free) {
        if (e) cudaEventDestroy(e);
      }
      if (lane.tail) cudaEventDestroy(lane.tail);
      if (lane.copy) cudaStreamDestroy(lane.copy);
      if (lane.kernel) cudaStreamDestroy(lane.kernel);
    }
    jobs_.ForEach([this](Job& job) { DestroyJobResources(&job); });
    if (compute_event_) cudaEventDestroy(compute_event_);
    for (const PinnedRange& r : pinned_) {
      if (r.ownership == Ownership::kAllocated) {
        cudaFreeHost(reinterpret_cast<void*>(r.base));
      } else if (r.ownership == Ownership::kRegistered) {
        cudaHostUnregister(reinterpret_cast<void*>(r.base));
      }
    }
  }

  Status Init() {
    KVO_RETURN_IF_ERROR(CheckDevice(device_));
    KVO_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    int sms = 0;
    KVO_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device_));
    kernel_ctas_ = tuning_.kernel_ctas > 0 ? tuning_.kernel_ctas : 4 * sms;
    sms_ = sms;
    int least = 0, greatest = 0;
    KVO_CUDA_RETURN_IF_ERROR(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    KVO_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&compute_event_, cudaEventDisableTiming));
    for (Lane& lane : lanes_) {
      KVO_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&lane.copy, cudaStreamNonBlocking));
      KVO_CUDA_RETURN_IF_ERROR(
          cudaStreamCreateWithPriority(&lane.kernel, cudaStreamNonBlocking, greatest));
      for (int s = 0; s < 2; ++s) {
        KVO_CUDA_RETURN_IF_ERROR(cudaMalloc(&lane.staging[s], tuning_.staging_chunk_bytes));
        KVO_CUDA_RETURN_IF_ERROR(
            cudaEventCreateWithFlags(&lane.slot_ready[s], cudaEventDisableTiming));
        KVO_CUDA_RETURN_IF_ERROR(
            cudaEventCreateWithFlags(&lane.slot_free[s], cudaEventDisableTiming));
      }
      KVO_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&lane.tail, cudaEventDisableTiming));
    }
    return Status::Ok();
  }

  std::string_view name() const override { return "cuda"; }

  Result<HostRegion> AllocateHostRegion(uint64_t num_slots, uint64_t row_stride) override {
    if (num_slots == 0 || row_stride == 0) {
      return Status::InvalidArgument(
          "cuda AllocateHostRegion: num_slots and row_stride must be > 0");
    }
    if (row_stride > UINT64_MAX / num_slots) {
      return Status::InvalidArgument("cuda AllocateHostRegion: num_slots * row_stride overflows");
    }
    uint64_t bytes = num_slots * row_stride;
    MutexLock lock(&mu_);
    KVO_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    void* p = nullptr;
    KVO_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
    void* d = nullptr;
    cudaError_t err = cudaHostGetDevicePointer(&d, p, 0);
    if (err != cudaSuccess) {
      cudaFreeHost(p);
      return CudaStatus(err, "cudaHostGetDevicePointer(host region)");
    }
    pinned_.push_back({reinterpret_cast<uintptr_t>(p), bytes, reinterpret_cast<uintptr_t>(d),
                       Ownership::kAllocated});
    HostRegion region;
    region.base = reinterpret_cast<uintptr_t>(p);
    region.num_slots = num_slots;
    region.row_stride = row_stride;
    return region;
  }

  Status RegisterLayout(const KvLayout& layout, const HostRegion& region) override {
    MutexLock lock(&mu_);
    if (layout_)
      return Status::FailedPrecondition("cuda RegisterLayout: layout already registered");
    KVO_RETURN_IF_ERROR(layout.CheckHostRegion(region));
    KVO_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    if (FindPinned(region.base, region.bytes()) == nullptr) {
      void* base = reinterpret_cast<void*>(region.base);
      cudaPointerAttributes attr{};
      cudaError_t aerr = cudaPointerGetAttributes(&attr, base);
      if (aerr != cudaSuccess) cudaGetLastError();
      if (aerr == cudaSuccess && attr.type == cudaMemoryTypeHost && attr.devicePointer != nullptr) {
        // Already pinned and mapped by its owner (another engine, a PinnedBuffer): use it as is.
        pinned_.push_back({region.base, region.bytes(),
                           reinterpret_cast<uintptr_t>(attr.devicePointer), Ownership::kNone});
        layout_ = std::make_unique<KvLayout>(layout);
        region_ = region;
        return Status::Ok();
      }
      cudaError_t err =
          cudaHostRegister(base, region.bytes(), cudaHostRegisterMapped | cudaHostRegisterPortable);
      if (err == cudaSuccess) {
        void* d = nullptr;
        err = cudaHostGetDevicePointer(&d, base, 0);
        if (err != cudaSuccess) {
          cudaHostUnregister(base);
          return CudaStatus(err, "cudaHostGetDevicePointer(registered host region)");
        }
        pinned_.push_back(
            {region.base, region.bytes(), reinterpret_cast<uintptr_t>(d), Ownership::kRegistered});
      } else {
        cudaGetLastError();  // not sticky; clear it
        KVO_LOG_WARN(
            "cuda engine: cudaHostRegister of {} bytes failed ({}); copies of this region "
            "use unpinned DMA",
            region.bytes(), cudaGetErrorString(err));
      }
    }
    layout_ = std::make_unique<KvLayout>(layout);
    region_ = region;
    return Status::Ok();
  }

  Result<JobId> Submit(TransferRequest request) override {
    MutexLock lock(&mu_);
    const bool d2h = request.direction == TransferDirection::kGpuToCpu;
    // A block spec is checked whole here (counts, slots, every block id: O(blocks), no segment
    // generated) and expanded later: chunk by chunk by the staging planner, in host order, so the
    // GPU starts after chunk 0's segments; all at once for the other methods. Raw segments are
    // validated and used where they are.
    std::vector<CopySegment>* segs = &request.segments;
    HostRowExpander* source = nullptr;
    uint64_t total = 0;
    uint64_t count = 0;  // segments, for auto's average (see below for a block spec)
    bool host_pinned = true;
    if (request.blocks.has_value()) {
      if (!layout_) {
        return Status::FailedPrecondition("cuda transfer job: block spec before RegisterLayout");
      }
      KVO_RETURN_IF_ERROR(expander_.Begin(*layout_, *request.blocks, region_, request.direction));
      if (expander_.total_bytes() == 0) {
        return Status::InvalidArgument("cuda transfer job: no segments");
      }
      source = &expander_;
      total = expander_.total_bytes();
      // Every host address of the spec lies in a row of the registered region (Begin checked
      // each slot against it): one lookup for the job.
      host_pinned = FindPinned(region_.base, region_.bytes()) != nullptr;
    } else {
      if (segs->empty()) return Status::InvalidArgument("cuda transfer job: no segments");
      KVO_RETURN_IF_ERROR(ValidateSegments(*segs, 1));
      for (const CopySegment& s : *segs) total += s.bytes;
      count = segs->size();
      for (const CopySegment& s : *segs) {
        if (!HostToDevice(d2h ? s.dst : s.src, s.bytes).ok()) {
          host_pinned = false;
          break;
        }
      }
    }
    KVO_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    // Busy: the compute stream still has queued work (this job will run beside it).
    const cudaError_t q = cudaStreamQuery(compute_);
    if (q != cudaSuccess && q != cudaErrorNotReady) {
      return CudaStatus(q, "cudaStreamQuery(compute)");
    }
    const bool busy = q == cudaErrorNotReady;
    CopyMethod method = method_;
    if (method == CopyMethod::kAuto) {
      if (source != nullptr) {
        // auto looks at the average merged segment only to ask whether it reaches
        // auto_large_segment_bytes: counting stops once the count shows it cannot (a few hundred
        // segments for a job of small pages), so this is not a pass over the job.
        const uint64_t large = std::max<uint64_t>(tuning_.auto_large_segment_bytes, 1);
        count = source->CountSegments(total / large);
      }
      method = ChooseCopyMethod(tuning_, total, count, busy, host_pinned);
    }
    if (method == CopyMethod::kKernel && !host_pinned) {
      return Status::InvalidArgument(
          "cuda transfer job: copy_method 'kernel' needs pinned host memory (AllocateHostRegion "
          "or a registered region)");
    }

    auto job = std::make_shared<Job>();
    job->id = next_id_++;
    job->direction = request.direction;
    job->method = method;
    job->busy = busy;
    job->bytes = total;
    Lane& lane = lanes_[static_cast<int>(request.direction)];
    if (source != nullptr && method != CopyMethod::kStaging) {
      // The other methods take the whole list: expand it now, in host order.
      segs_.clear();
      source->Fill(&segs_, UINT64_MAX);
      segs = &segs_;
      source = nullptr;
    }
    Status st = Enqueue(lane, job.get(), segs, source, d2h, request.wait_event);
    if (!st.ok()) {
      KVO_LOG_WARN("cuda transfer job {} failed to enqueue: {}", job->id, st.ToString());
      job->status = st;
      // Part of the job may be queued already (earlier chunks' kernels and copies, earlier DMA
      // calls). A failed job is reported at once and its descriptor block, staging slots and the
      // caller's rows are reused, so the queued part must finish first: otherwise its kernels
      // read the next job's descriptors and a D2H copy keeps writing into rows freed for other
      // blocks. Rare (an enqueue error), so the lane is simply synchronised.
      const cudaError_t a = cudaStreamSynchronize(lane.copy);
      const cudaError_t b = cudaStreamSynchronize(lane.kernel);
      if (a != cudaSuccess || b != cudaSuccess) {
        KVO_LOG_ERROR("cuda transfer job {}: waiting for its queued part: {}", job->id,
                      CudaStatus(a != cudaSuccess ? a : b, "cudaStreamSynchronize").ToString());
        cudaGetLastError();
      }
    }
    jobs_.Push(static_cast<size_t>(request.direction), job);
    recent_methods_.emplace_back(job->id, method);
    if (recent_methods_.size() > 4096) recent_methods_.pop_front();
    return job->id;
  }

  // In order per direction (transfer/job.h): a lane's front job is finished once its end event
  // completed or it failed (an enqueue error, or the event query reports one).
  void TakeFinished(std::vector<TransferResult>* out) override {
    MutexLock lock(&mu_);
    cudaSetDevice(device_);
    auto finished = [](Job& job) {
      if (!job.status.ok()) return true;
      const cudaError_t q = cudaEventQuery(job.end);
      if (q == cudaErrorNotReady) return false;
      if (q != cudaSuccess) job.status = CudaStatus(q, "transfer job");
      return true;
    };
    jobs_.TakeFinished(finished, [this, out](const std::shared_ptr<Job>& job) {
      TransferResult r;
      r.job_id = job->id;
      r.direction = job->direction;
      r.bytes = job->bytes;
      if (job->status.ok()) {
        float ms = 0;
        cudaError_t e = cudaEventElapsedTime(&ms, job->start, job->end);
        if (e == cudaSuccess) r.seconds = ms / 1000.0;
      }
      r.success = job->status.ok();
      r.status = job->status;
      DestroyJobResources(job.get());
      out->push_back(std::move(r));
    });
  }

  // Synchronises under the lock so TakeFinished cannot destroy the job's event meanwhile; copies
  // never need the lock to progress, so this only delays other callers of the engine.
  Status Wait(JobId id) override {
    MutexLock lock(&mu_);
    std::shared_ptr<Job> job = jobs_.Find(id);
    if (!job) return Status::NotFound("cuda transfer: no pending job " + std::to_string(id));
    if (!job->status.ok()) return job->status;
    KVO_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    KVO_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(job->end));
    return Status::Ok();
  }

  void Drain() override {
    MutexLock lock(&mu_);
    cudaSetDevice(device_);
    jobs_.ForEach([](Job& job) {
      if (job.end) cudaEventSynchronize(job.end);
    });
  }

  Result<CopyMethod> MethodOf(JobId id) {
    MutexLock lock(&mu_);
    for (const auto& [jid, m] : recent_methods_) {
      if (jid == id) return m;
    }
    return Status::NotFound("cuda transfer: unknown job " + std::to_string(id));
  }

 private:
  void DestroyJobResources(Job* job) {
    if (job->start) cudaEventDestroy(job->start);
    if (job->end) cudaEventDestroy(job->end);
    job->start = job->end = nullptr;
    descriptor_pool_.Release(job->descs);
    job->descs = {};
    job->batch_ptrs.clear();
    job->batch_sizes.clear();
  }

  const PinnedRange* FindPinned(uintptr_t addr, uint64_t bytes) const {
    for (const PinnedRange& r : pinned_) {
      if (addr >= r.base && addr - r.base <= r.bytes && bytes <= r.bytes - (addr - r.base)) {
        return &r;
      }
    }
    return nullptr;
  }

  // Device-usable address of pinned host memory; an error when `host` is not pinned and mapped.
  Result<uintptr_t> HostToDevice(uintptr_t host, uint64_t bytes) {
    if (const PinnedRange* r = FindPinned(host, bytes)) return r->device + (host - r->base);
    cudaPointerAttributes attr{};
    cudaError_t err = cudaPointerGetAttributes(&attr, reinterpret_cast<const void*>(host));
    if (err != cudaSuccess) {
      cudaGetLastError();
      return CudaStatus(err, "cudaPointerGetAttributes");
    }
    if (attr.type != cudaMemoryTypeHost || attr.devicePointer == nullptr) {
      return Status::InvalidArgument("host address is not pinned, mapped memory");
    }
    return reinterpret_cast<uintptr_t>(attr.devicePointer);
  }

  // `source`: a staging job's block spec, expanded as it is planned (then `segs` is unused).
  Status Enqueue(Lane& lane, Job* job, std::vector<CopySegment>* segs, HostRowExpander* source,
                 bool d2h, uintptr_t wait_event) {
    KVO_CUDA_RETURN_IF_ERROR(cudaEventCreate(&job->start));
    KVO_CUDA_RETURN_IF_ERROR(cudaEventCreate(&job->end));
    // Both streams of the direction first wait for the compute stream's work queued so far.
    KVO_CUDA_RETURN_IF_ERROR(cudaEventRecord(compute_event_, compute_));
    for (cudaStream_t s : {lane.copy, lane.kernel}) {
      KVO_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(s, compute_event_, 0));
      if (wait_event != 0) {
        KVO_CUDA_RETURN_IF_ERROR(
            cudaStreamWaitEvent(s, reinterpret_cast<cudaEvent_t>(wait_event), 0));
      }
    }
    cudaStream_t final_stream = nullptr;
    switch (job->method) {
      case CopyMethod::kStaging:
        KVO_RETURN_IF_ERROR(EnqueueStaging(lane, job, segs, source, d2h, &final_stream));
        break;
      case CopyMethod::kKernel:
        KVO_RETURN_IF_ERROR(EnqueueKernel(lane, job, *segs, d2h, &final_stream));
        break;
      case CopyMethod::kBatch:
      case CopyMethod::kDma: {
        KVO_CUDA_RETURN_IF_ERROR(cudaEventRecord(job->start, lane.copy));
        copies_.clear();
        for (const CopySegment& s : *segs) copies_.push_back({s.dst, s.src, s.bytes});
        KVO_RETURN_IF_ERROR(
            EnqueueDma(job, copies_, lane.copy, job->method == CopyMethod::kBatch, d2h));
        final_stream = lane.copy;
        break;
      }
      case CopyMethod::kAuto:
        return Status::Internal("cuda transfer: unresolved auto method");
    }
    // In-order completion per direction: the end waits for the previous job's end.
    KVO_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(final_stream, lane.tail, 0));
    KVO_CUDA_RETURN_IF_ERROR(cudaEventRecord(job->end, final_stream));
    KVO_CUDA_RETURN_IF_ERROR(cudaEventRecord(lane.tail, final_stream));
    return Status::Ok();
  }

  // Copy-engine copies on `stream`: one cudaMemcpyAsync each (dma, or a single copy), or
  // cudaMemcpyBatchAsync in calls of at most max_batch descriptors.
  Status EnqueueDma(Job* job, const std::vector<DmaCopy>& copies, cudaStream_t stream, bool batch,
                    bool d2h) {
    if (!batch || copies.size() == 1) {
      for (const DmaCopy& c : copies) {
        KVO_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(reinterpret_cast<void*>(c.dst),
                                                 reinterpret_cast<const void*>(c.src), c.bytes,
                                                 cudaMemcpyDefault, stream));
      }
      return Status::Ok();
    }
    (void)d2h;
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.flags = cudaMemcpyFlagDefault;
    size_t attr_index = 0;
    for (size_t begin = 0; begin < copies.size(); begin += tuning_.max_batch) {
      size_t n = std::min<size_t>(tuning_.max_batch, copies.size() - begin);
      std::vector<void*>& ptrs = job->batch_ptrs.emplace_back(2 * n);
      std::vector<size_t>& sizes = job->batch_sizes.emplace_back(n);
      for (size_t i = 0; i < n; ++i) {
        ptrs[i] = reinterpret_cast<void*>(copies[begin + i].dst);
        ptrs[n + i] = reinterpret_cast<void*>(copies[begin + i].src);
        sizes[i] = copies[begin + i].bytes;
      }
      KVO_CUDA_RETURN_IF_ERROR(cudaMemcpyBatchAsync(ptrs.data(), ptrs.data() + n, sizes.data(), n,
                                                    &attr, &attr_index, 1, stream));
    }
    return Status::Ok();
  }

  // Zero-copy: one kernel reads/writes the host side through mapped pinned memory.
  Status EnqueueKernel(Lane& lane, Job* job, const std::vector<CopySegment>& segs, bool d2h,
                       cudaStream_t* final_stream) {
    std::vector<CopyDesc> descs;
    descs.reserve(segs.size());
    for (const CopySegment& s : segs) {
      uintptr_t src = s.src, dst = s.dst;
      if (d2h) {
        KVO_ASSIGN_OR_RETURN(dst, HostToDevice(s.dst, s.bytes));
      } else {
        KVO_ASSIGN_OR_RETURN(src, HostToDevice(s.src, s.bytes));
      }
      AppendPieces(src, dst, s.bytes, &descs);
    }
    KVO_ASSIGN_OR_RETURN(job->descs, descriptor_pool_.Acquire(descs.size()));
    std::copy(descs.begin(), descs.end(), job->descs.host);
    KVO_CUDA_RETURN_IF_ERROR(cudaEventRecord(job->start, lane.kernel));
    KVO_CUDA_RETURN_IF_ERROR(cuda_internal::LaunchCopyPieces(
        job->descs.mapped, descs.size(), kernel_ctas_, tuning_.threads, lane.kernel));
    *final_stream = lane.kernel;
    return Status::Ok();
  }

  void AppendPieces(uintptr_t src, uintptr_t dst, uint64_t bytes, std::vector<CopyDesc>* out) {
    for (uint64_t off = 0; off < bytes; off += tuning_.piece_bytes) {
      uint64_t n = std::min(tuning_.piece_bytes, bytes - off);
      out->push_back({src + off, dst + off, n, 0});
    }
  }

  // Staging: segments ordered by host address (OrderByHost: linear when a block spec's rows
  // already ascend) are packed into staging chunks (the host side of a chunk is then a few
  // contiguous runs). Per chunk, D2H: gather kernel (kernel stream) -> DMA of the runs (copy
  // stream); H2D: DMA of the runs -> scatter kernel. Two staging slots per direction, guarded by
  // slot_ready / slot_free events, let chunk i+1's kernel overlap chunk i's DMA. Chunks are
  // planned (transfer/staging_plan.h) and enqueued one at a time, so the GPU starts on chunk 0
  // while the host still plans the rest; each chunk's descriptors go to device memory just
  // before its kernel needs them.
  Status EnqueueStaging(Lane& lane, Job* job, std::vector<CopySegment>* segs,
                        HostRowExpander* source, bool d2h, cudaStream_t* final_stream) {
    if (source == nullptr) KVO_RETURN_IF_ERROR(OrderByHost(segs, d2h, &order_scratch_).status());
    const StagingShape& shape = job->busy ? tuning_.staging_busy : tuning_.staging_idle;
    const int ctas = shape.ctas > 0 ? shape.ctas : 4 * sms_;
    StagingPlanner::Params params;
    params.chunk_bytes = tuning_.staging_chunk_bytes;
    params.piece_bytes = shape.piece_bytes;
    params.staging = {reinterpret_cast<uintptr_t>(lane.staging[0]),
                      reinterpret_cast<uintptr_t>(lane.staging[1])};
    params.first_slot = lane.next_slot;
    params.d2h = d2h;
    const size_t max_descs =
        source != nullptr
            ? StagingPlanner::MaxDescs(source->MaxPieces(params.piece_bytes), job->bytes, params)
            : StagingPlanner::MaxDescs(*segs, job->bytes, params);
    KVO_ASSIGN_OR_RETURN(job->descs, descriptor_pool_.Acquire(max_descs));
    if (source != nullptr) {
      planner_.Begin(source, job->bytes, params, job->descs.host, job->descs.capacity);
    } else {
      planner_.Begin(*segs, job->bytes, params, job->descs.host, job->descs.capacity);
    }
    // The job's GPU time starts here (planning chunk 0 and the ordering above are not in it).
    KVO_CUDA_RETURN_IF_ERROR(cudaEventRecord(job->start, d2h ? lane.kernel : lane.copy));
    StagingChunk c;
    size_t chunks = 0;
    while (planner_.Next(&c)) {
      ++chunks;
      ++lane.next_slot;
      const int slot = static_cast<int>(c.slot);
      const uintptr_t stage = params.staging[c.slot];
      copies_.clear();
      for (const StagingRun& r : planner_.runs()) {
        if (d2h) {
          copies_.push_back({r.host, stage + r.offset, r.bytes});
        } else {
          copies_.push_back({stage + r.offset, r.host, r.bytes});
        }
      }
      const size_t n = c.desc_end - c.desc_begin;
      CopyDesc* dev = job->descs.device + c.desc_begin;
      const CopyDesc* host = job->descs.host + c.desc_begin;
      if (d2h) {
        // Descriptors host->device on the kernel stream while the DMAs go device->host.
        KVO_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(dev, host, n * sizeof(CopyDesc), cudaMemcpyHostToDevice, lane.kernel));
        KVO_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(lane.kernel, lane.slot_free[slot], 0));
        KVO_CUDA_RETURN_IF_ERROR(
            cuda_internal::LaunchCopyPieces(dev, n, ctas, shape.threads, lane.kernel));
        KVO_CUDA_RETURN_IF_ERROR(cudaEventRecord(lane.slot_ready[slot], lane.kernel));
        KVO_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(lane.copy, lane.slot_ready[slot], 0));
        KVO_RETURN_IF_ERROR(EnqueueDma(job, copies_, lane.copy, /*batch=*/true, d2h));
        KVO_CUDA_RETURN_IF_ERROR(cudaEventRecord(lane.slot_free[slot], lane.copy));
      } else {
        // Descriptors on the copy stream before the chunk's DMA: the scatter waits for that
        // DMA's event, so for its descriptors too (no extra copy queued behind a DMA).
        KVO_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(lane.copy, lane.slot_free[slot], 0));
        KVO_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(dev, host, n * sizeof(CopyDesc), cudaMemcpyHostToDevice, lane.copy));
        KVO_RETURN_IF_ERROR(EnqueueDma(job, copies_, lane.copy, /*batch=*/true, d2h));
        KVO_CUDA_RETURN_IF_ERROR(cudaEventRecord(lane.slot_ready[slot], lane.copy));
        KVO_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(lane.kernel, lane.slot_ready[slot], 0));
        KVO_CUDA_RETURN_IF_ERROR(
            cuda_internal::LaunchCopyPieces(dev, n, ctas, shape.threads, lane.kernel));
        KVO_CUDA_RETURN_IF_ERROR(cudaEventRecord(lane.slot_free[slot], lane.kernel));
      }
    }
    if (planner_.overflowed() || chunks == 0) {
      return Status::Internal("cuda staging: planning ran past " +
                              std::to_string(job->descs.capacity) + " descriptors or " +
                              std::to_string(job->bytes) + " bytes");
    }
    if (d2h) {
      // The copy stream's end also covers the gathers (each DMA waited for its gather).
      *final_stream = lane.copy;
    } else {
      *final_stream = lane.kernel;
    }
    return Status::Ok();
  }

  const int device_;
  cudaStream_t compute_;
  const CudaEngineTuning tuning_;
  const CopyMethod method_;
  int kernel_ctas_ = 0;
  int sms_ = 0;

  Mutex mu_;
  cudaEvent_t compute_event_ = nullptr;
  std::array<Lane, 2> lanes_;     // indexed by TransferDirection
  InOrderJobQueue<Job, 2> jobs_;  // one lane per TransferDirection
  std::vector<PinnedRange> pinned_;
  DescriptorPool descriptor_pool_;
  std::unique_ptr<KvLayout> layout_;
  HostRegion region_;
  JobId next_id_ = 1;
  std::deque<std::pair<JobId, CopyMethod>> recent_methods_;
  // Per-submit work buffers, reused (their capacity stays): no heap allocation per job once grown.
  std::vector<CopySegment> segs_;
  HostRowExpander expander_;
  HostOrderScratch order_scratch_;
  StagingPlanner planner_;
  std::vector<DmaCopy> copies_;
};

}  // namespace

std::string_view CopyMethodName(CopyMethod method) {
  switch (method) {
    case CopyMethod::kAuto:
      return "auto";
    case CopyMethod::kStaging:
      return "staging";
    case CopyMethod::kKernel:
      return "kernel";
    case CopyMethod::kBatch:
      return "batch";
    case CopyMethod::kDma:
      return "dma";
  }
  return "unknown";
}

Result<CopyMethod> ParseCopyMethod(std::string_view name) {
  for (CopyMethod m : {CopyMethod::kAuto, CopyMethod::kStaging, CopyMethod::kKernel,
                       CopyMethod::kBatch, CopyMethod::kDma}) {
    if (name == CopyMethodName(m)) return m;
  }
  return Status::InvalidArgument("copy_method '" + std::string(name) +
                                 "' is not one of auto, staging, kernel, batch, dma");
}

CopyMethod ChooseCopyMethod(const CudaEngineTuning& tuning, uint64_t total_bytes, uint64_t segments,
                            bool busy, bool host_pinned) {
  const uint64_t average = segments == 0 ? 0 : total_bytes / segments;
  // Large segments: the copy engines are at the ceiling and cost the SMs nothing.
  if (average >= tuning.auto_large_segment_bytes) return CopyMethod::kBatch;
  // Unpinned host memory: only the copy engines can reach it.
  if (!host_pinned) return CopyMethod::kBatch;
  // A small job on an idle GPU: one zero-copy kernel has the lowest latency.
  if (!busy && total_bytes <= tuning.auto_small_job_bytes) return CopyMethod::kKernel;
  // Everything else: gather/scatter at HBM speed with a few high-priority CTAs, one DMA stream.
  return CopyMethod::kStaging;
}

Result<std::unique_ptr<TransferEngine>> MakeCudaTransferEngine(const TransferEngineOptions& options,
                                                               const CudaEngineTuning& tuning) {
  KVO_ASSIGN_OR_RETURN(CopyMethod method, ParseCopyMethod(options.copy_method));
  auto bad_threads = [](int t) { return t <= 0 || t % 32 != 0 || t > 1024; };
  auto bad_shape = [&](const StagingShape& sh) {
    return sh.ctas < 0 || bad_threads(sh.threads) || sh.piece_bytes == 0 ||
           sh.piece_bytes % 16 != 0;
  };
  if (tuning.staging_chunk_bytes < (1 << 20) || tuning.staging_chunk_bytes % 4096 != 0 ||
      tuning.piece_bytes == 0 || tuning.piece_bytes % 16 != 0 || bad_shape(tuning.staging_idle) ||
      bad_shape(tuning.staging_busy) || tuning.kernel_ctas < 0 || bad_threads(tuning.threads) ||
      tuning.max_batch == 0) {
    return Status::InvalidArgument(
        "cuda engine tuning: staging_chunk_bytes >= 1 MiB and a multiple of 4096, piece sizes "
        "nonzero multiples of 16, "
        "CTA counts >= 0, threads multiples of 32 up to 1024, max_batch > 0");
  }
  auto engine = std::make_unique<CudaTransferEngine>(options, tuning, method);
  KVO_RETURN_IF_ERROR(engine->Init());
  return std::unique_ptr<TransferEngine>(std::move(engine));
}

Result<CopyMethod> JobMethod(TransferEngine* engine, JobId job) {
  auto* cuda_engine = dynamic_cast<CudaTransferEngine*>(engine);
  if (cuda_engine == nullptr) return Status::NotFound("not a cuda transfer engine");
  return cuda_engine->MethodOf(job);
}

Status RegisterCudaTransferEngine() {
  static const Status status = RegisterTransferEngine(
      "cuda", [](const TransferEngineOptions& o) { return MakeCudaTransferEngine(o); });
  return status;
}

}  // namespace kvo::cuda
