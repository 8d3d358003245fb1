// The public header of kvo_transfer_cuda: the CUDA TransferEngine (transfer/transfer_engine.h)
// and the few device helpers the tests and `kvo bench transfer` need. No CUDA header is included
// here: streams, events and device addresses cross this boundary as integers, so code outside
// transfer/cuda compiles without the toolkit.
//
// The engine (DESIGN.md in this folder has the whole picture):
//   - host memory: AllocateHostRegion pins one region with cudaHostAlloc (mapped, portable) at
//     start; RegisterLayout with external memory (e.g. vLLM's /dev/shm region) registers it with
//     cudaHostRegister, falling back to unpinned copies with a warning, as vLLM does.
//   - per direction two streams (a copy stream and a high-priority kernel stream) that first wait
//     on the engine's compute stream (an event recorded at Submit) and on the previous job of the
//     direction, so jobs of one direction complete in submission order.
//   - copy methods: staging (gather/scatter kernel into a double-buffered device staging buffer +
//     DMA of the contiguous host runs), kernel (zero-copy gather/scatter through mapped pinned
//     memory), batch (cudaMemcpyBatchAsync), dma (one cudaMemcpyAsync per segment), auto.
//   - completion and timing by CUDA events; TakeFinished polls them in FIFO order per direction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/result.h"
#include "common/status.h"
#include "transfer/transfer_engine.h"

namespace kvo::cuda {

enum class CopyMethod : uint8_t { kAuto, kStaging, kKernel, kBatch, kDma };
std::string_view CopyMethodName(CopyMethod method);  // "auto" | "staging" | ...
// InvalidArgument naming the value and the accepted names.
Result<CopyMethod> ParseCopyMethod(std::string_view name);

// The launch shape of the staging gather/scatter kernel.
struct StagingShape {
  int ctas = 0;  // 0: 4 per SM
  int threads = 256;
  uint64_t piece_bytes = 8 << 10;  // one warp's unit of work
};

// Knobs beyond TransferEngineOptions (defaults are what the H200 measurements chose).
struct CudaEngineTuning {
  uint64_t staging_chunk_bytes = 16ull << 20;  // one staging buffer; two per direction
  // Staging kernel shape on an idle GPU: a few long-lived CTAs (gentle on HBM, so the DMA reading
  // or writing the staging buffer keeps its pace). 0 CTAs: 4 per SM.
  StagingShape staging_idle = {8, 512, 64 << 10};
  // Staging kernel shape while the compute stream is busy: many short CTAs (one small piece per
  // warp, a few microseconds each) so no compute CTA waits long for a slot.
  StagingShape staging_busy = {0, 256, 8 << 10};
  // Zero-copy kernel: pieces per warp, CTAs (0: 4 per SM) and threads per CTA.
  uint64_t piece_bytes = 64 << 10;
  int kernel_ctas = 0;
  int threads = 512;
  uint64_t max_batch = 8192;  // descriptors per cudaMemcpyBatchAsync call
  // auto: jobs whose average segment is at least this large go to the copy engines (batch).
  uint64_t auto_large_segment_bytes = 1ull << 20;
  // auto: jobs this small run as one zero-copy kernel when the GPU is idle (lowest latency).
  uint64_t auto_small_job_bytes = 256 << 10;
};

// What `auto` would pick for a job of `total_bytes` in `segments` segments; `busy` is whether
// the compute stream has unfinished work; `host_pinned` whether every host address is pinned.
CopyMethod ChooseCopyMethod(const CudaEngineTuning& tuning, uint64_t total_bytes, uint64_t segments,
                            bool busy, bool host_pinned);

// The CUDA engine. Unavailable when there is no driver or no such device.
Result<std::unique_ptr<TransferEngine>> MakeCudaTransferEngine(const TransferEngineOptions& options,
                                                               const CudaEngineTuning& tuning = {});

// The method the engine used for a finished or pending job (for tests and the benchmark).
// NotFound for an unknown job or an engine that is not the CUDA engine.
Result<CopyMethod> JobMethod(TransferEngine* engine, JobId job);

// ---- Device helpers (tests, benchmark) ---------------------------------------------------

// Ok when `device` exists and the driver works; Unavailable (with the CUDA error) otherwise.
Status CheckDevice(int device);
// Number of SMs of `device`.
Result<int> MultiprocessorCount(int device);

// Device memory (cudaMalloc), freed by the destructor.
class DeviceBuffer {
 public:
  static Result<DeviceBuffer> Allocate(uint64_t bytes);
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  ~DeviceBuffer();
  uintptr_t addr() const { return addr_; }
  uint64_t bytes() const { return bytes_; }

 private:
  uintptr_t addr_ = 0;
  uint64_t bytes_ = 0;
};

// Pinned, mapped host memory (cudaHostAlloc), freed by the destructor.
class PinnedBuffer {
 public:
  static Result<PinnedBuffer> Allocate(uint64_t bytes);
  PinnedBuffer() = default;
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  ~PinnedBuffer();
  uint8_t* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }

 private:
  uint8_t* data_ = nullptr;
  uint64_t bytes_ = 0;
};

// Synchronous helpers (the device is synchronised before they return).
Status CopyHostToDevice(uintptr_t dst, const void* src, uint64_t bytes);
Status CopyDeviceToHost(void* dst, uintptr_t src, uint64_t bytes);
Status FillDevice(uintptr_t dst, uint8_t value, uint64_t bytes);
Status DeviceSynchronize();

// A CUDA stream (cudaStreamNonBlocking) as an integer handle for TransferEngineOptions.
class Stream {
 public:
  static Result<Stream> Create(bool high_priority = false);
  Stream() = default;
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  ~Stream();
  uintptr_t handle() const { return handle_; }
  Status Synchronize() const;

 private:
  uintptr_t handle_ = 0;
};

// A timing event as an integer handle.
class Event {
 public:
  static Result<Event> Create();
  Event() = default;
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  ~Event();
  uintptr_t handle() const { return handle_; }
  Status Record(uintptr_t stream) const;
  Status Synchronize() const;
  // Milliseconds from `start` to this event (both recorded and complete).
  Result<double> MillisSince(const Event& start) const;

 private:
  uintptr_t handle_ = 0;
};

// Kernels for tests and the benchmark, enqueued on `stream`:
// spins `delay_ns`, then writes byte pattern Pattern(seed, i) to dst[0..bytes).
Status LaunchDelayedFill(uintptr_t stream, uintptr_t dst, uint64_t bytes, uint32_t seed,
                         uint64_t delay_ns);
uint8_t DelayedFillPattern(uint32_t seed, uint64_t i);
// A full-occupancy arithmetic kernel: `ctas` blocks of 256 threads, `iters` FMAs per thread;
// `sink` is device memory of ctas * 256 floats.
Status LaunchBusyKernel(uintptr_t stream, uintptr_t sink, int ctas, int iters);

// A CUDA graph of `count` busy kernels (LaunchBusyKernel's), captured on `stream` and
// instantiated: the benchmark's forward-pass stand-in launched the way vLLM launches decode steps.
class BusyGraph {
 public:
  static Result<BusyGraph> Capture(uintptr_t stream, uintptr_t sink, int ctas, int iters,
                                   int count);
  BusyGraph() = default;
  BusyGraph(BusyGraph&& other) noexcept;
  BusyGraph& operator=(BusyGraph&& other) noexcept;
  ~BusyGraph();
  Status Launch(uintptr_t stream) const;
  int count() const { return count_; }

 private:
  uintptr_t exec_ = 0;
  int count_ = 0;
};

// Copies `bytes` with one cudaMemcpyAsync on `stream` (the contiguous-copy ceiling).
Status CopyAsync(uintptr_t stream, uintptr_t dst, uintptr_t src, uint64_t bytes);
// Makes `stream` wait for `event` (cudaStreamWaitEvent).
Status StreamWaitEvent(uintptr_t stream, const Event& event);

// Registers "cuda" in the TransferEngine registry (idempotent). `kvo` gets this from a static
// initializer in the object library kvo_transfer_cuda_register (tools/CMakeLists.txt).
Status RegisterCudaTransferEngine();

}  // namespace kvo::cuda
