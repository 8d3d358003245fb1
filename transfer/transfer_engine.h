// TransferEngine: asynchronous copies between the engine's KV cache ("GPU" side) and the CPU tier
// (host rows), vLLM's OffloadingHandler / SingleDirectionOffloadingHandler (vllm-compat.md B.10).
//
//   Submit(request)  queues a job (raw segments or a block-level spec) and returns its id at once;
//                    it never waits for a copy. Invalid input is an error here (no job made).
//   TakeFinished(out) appends finished jobs: per direction in submission order, stopping at the
//                    first unfinished job of that direction (vLLM's FIFO poll). Each result has
//                    success, bytes and elapsed seconds (vLLM's TransferResult); a job that
//                    failed carries its Status. A result is returned exactly once.
//   Wait(job)        blocks until that job (and every earlier job of its direction) finished; its
//                    result stays queued for TakeFinished. Returns the job's status.
//   Drain()          blocks until every submitted job finished (results stay queued).
//
// The verbs and result fields are the job contract every backend shares (transfer/job.h); the
// in-order completion is transfer/job.h's InOrderJobQueue, one lane per direction.
//
// Jobs of one direction complete in order; the two directions are independent. Implementations:
// the host engine (MakeHostTransferEngine, memcpy on an Executor, no GPU needed) and the CUDA
// engine (transfer/cuda, library kvo_transfer_cuda, MakeCudaTransferEngine). Code that does not
// care picks one by name through the registry (MakeTransferEngine("host"|"cuda", options)); CMake,
// not #ifdef, decides whether "cuda" is linked and registered.
//
// Thread-safety: every method may be called from any thread; one caller thread is the norm.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "common/status.h"
#include "transfer/job.h"
#include "transfer/kv_layout.h"

namespace kvo {

class Clock;
class Executor;

struct TransferRequest {
  TransferDirection direction = TransferDirection::kGpuToCpu;
  // Either raw segments (src/dst addresses; direction says which side is the GPU) ...
  std::vector<CopySegment> segments;
  // ... or a block-level spec, expanded against the registered layout and host region.
  std::optional<BlockTransferSpec> blocks;
  // CUDA engine: an event (cudaEvent_t as an integer) the copy must wait for in addition to the
  // engine's compute stream; 0 for none. The host engine ignores it.
  uintptr_t wait_event = 0;
};

// vLLM's TransferResult(job_id, success, transfer_size, transfer_time): the contract's job result
// (job_id, success, bytes the job moves, seconds from start to end of its copies, status non-ok
// when !success) and the direction.
struct TransferResult : JobResultFields {
  TransferDirection direction = TransferDirection::kGpuToCpu;
};

struct TransferEngineOptions {
  // Host engine: worker threads (ignored when `executor` is given). CUDA engine: unused.
  int num_threads = 4;
  // Runs host-engine copies; null: the engine owns a ThreadPool of num_threads.
  Executor* executor = nullptr;
  // Times jobs; null: SystemClock().
  Clock* clock = nullptr;
  // Host engine: a job is split into pieces of at least this many bytes across workers.
  uint64_t min_split_bytes = 1 << 20;
  // CUDA engine: "auto" | "staging" | "kernel" | "batch" | "dma" (issue #4 item 3).
  std::string copy_method = "auto";
  int device = 0;                // CUDA device ordinal
  uintptr_t compute_stream = 0;  // cudaStream_t the copies wait on (0: the legacy default stream)
};

class TransferEngine {
 public:
  virtual ~TransferEngine() = default;

  virtual std::string_view name() const = 0;  // "host" | "cuda"

  // Allocates a host region of `num_slots` rows of `row_stride` bytes that this engine can copy
  // to/from at full speed (host engine: page-aligned memory; CUDA engine: pinned, allocated
  // once). The engine owns the memory until it is destroyed.
  virtual Result<HostRegion> AllocateHostRegion(uint64_t num_slots, uint64_t row_stride) = 0;

  // Registers the KV layout and the host region block-level jobs use. Once, before any
  // block-level job; a second call is an error (FailedPrecondition). The region may come from
  // AllocateHostRegion or be external memory the caller keeps alive (the CUDA engine registers
  // external memory with the driver).
  virtual Status RegisterLayout(const KvLayout& layout, const HostRegion& region) = 0;

  // Queues a job. Errors (no job created): empty job, invalid segments, a block spec without a
  // registered layout or out of range.
  virtual Result<JobId> Submit(TransferRequest request) = 0;

  // Appends finished results (see the file comment for order).
  virtual void TakeFinished(std::vector<TransferResult>* out) = 0;

  // Blocks until `job` finished. NotFound for an id never submitted or already returned by
  // TakeFinished.
  virtual Status Wait(JobId job) = 0;

  // Blocks until every submitted job finished (results stay queued).
  virtual void Drain() = 0;
};

// The host engine: memcpy on worker threads. Any addresses are host addresses.
Result<std::unique_ptr<TransferEngine>> MakeHostTransferEngine(
    const TransferEngineOptions& options);

// Registry by name. "host" is always registered. The CUDA library registers "cuda" through
// RegisterTransferEngine (called from its own registration function). Thread-safe.
using TransferEngineFactory =
    std::function<Result<std::unique_ptr<TransferEngine>>(const TransferEngineOptions&)>;
Status RegisterTransferEngine(std::string name, TransferEngineFactory factory);
// NotFound naming the registered engines when `name` is unknown.
Result<std::unique_ptr<TransferEngine>> MakeTransferEngine(std::string_view name,
                                                           const TransferEngineOptions& options);
std::vector<std::string> RegisteredTransferEngines();

}  // namespace kvo
