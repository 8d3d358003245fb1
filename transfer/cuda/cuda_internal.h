// Internal to transfer/cuda: CUDA runtime helpers, the copy kernels' launchers and the descriptor
// format they read. Only files in transfer/cuda include this (and with it the CUDA headers).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"
#include "transfer/piece_desc.h"

namespace kvo::cuda_internal {

// Turns a CUDA error into a Status naming the call and the error; kUnavailable when there is no
// usable device or driver, kInternal otherwise.
Status CudaStatus(cudaError_t err, const char* what);

#define KVO_CUDA_RETURN_IF_ERROR(call)                               \
  do {                                                               \
    cudaError_t kvo_cuda_err_ = (call);                              \
    if (kvo_cuda_err_ != cudaSuccess) {                              \
      return ::kvo::cuda_internal::CudaStatus(kvo_cuda_err_, #call); \
    }                                                                \
  } while (0)

// One piece of a copy as the kernels see it: `bytes` from `src` to `dst` (device-usable
// addresses: device memory, or mapped pinned host memory). 32 bytes so a warp reads it in one go.
// The CUDA-free staging planner (transfer/staging_plan.h) writes these.
using CopyDesc = ::kvo::PieceDesc;

// Launches the warp-per-piece copy kernel: `count` descriptors read from `descs` (device or mapped
// pinned memory), `ctas` blocks of `threads` threads. 16-byte loads/stores where src, dst and size
// are 16-byte aligned, byte copies otherwise. Returns the launch error.
cudaError_t LaunchCopyPieces(const CopyDesc* descs, size_t count, int ctas, int threads,
                             cudaStream_t stream);

// Test and benchmark kernels. A kernel that spins for `delay_ns` then writes `bytes` bytes of
// the pattern byte(seed + i) to `dst` (a compute-stream write the copies must wait for).
cudaError_t LaunchDelayedFill(void* dst, size_t bytes, uint32_t seed, uint64_t delay_ns,
                              cudaStream_t stream);
// A full-occupancy arithmetic kernel (a forward-pass stand-in): `ctas` blocks of 256 threads,
// each thread doing `iters` dependent FMAs; writes one float per thread to `sink`.
cudaError_t LaunchBusyKernel(float* sink, int ctas, int iters, cudaStream_t stream);

}  // namespace kvo::cuda_internal
