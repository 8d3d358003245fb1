// The copy kernels of transfer/cuda: a warp-per-piece gather/scatter used both for the staging
// method (device <-> device staging buffer, HBM speed) and the zero-copy method (device <-> mapped
// pinned host memory over PCIe), plus two kernels the tests and the benchmark need.
#include <cuda_runtime.h>

#include "transfer/cuda/cuda_internal.h"

namespace kvo::cuda_internal {
namespace {

constexpr int kUnroll = 8;  // independent 16-byte loads in flight per lane

__device__ __forceinline__ void CopyVector(const uint4* __restrict__ src, uint4* __restrict__ dst,
                                           uint64_t n16, int lane) {
  uint64_t i = lane;
  for (; i + (kUnroll - 1) * 32 < n16; i += kUnroll * 32) {
    uint4 v[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) v[k] = src[i + k * 32];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) dst[i + k * 32] = v[k];
  }
  for (; i < n16; i += 32) dst[i] = src[i];
}

// Each warp takes descriptors in a grid-stride loop; the next descriptor is loaded before the
// current piece is copied so a descriptor read over PCIe (mapped pinned) overlaps the copy.
__global__ void CopyPiecesKernel(const CopyDesc* __restrict__ descs, uint64_t count) {
  const int lane = threadIdx.x & 31;
  const uint64_t warp = (static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const uint64_t warps = (static_cast<uint64_t>(gridDim.x) * blockDim.x) >> 5;
  uint64_t d = warp;
  if (d >= count) return;
  CopyDesc cur = descs[d];
  while (true) {
    uint64_t next_index = d + warps;
    CopyDesc next{};
    if (next_index < count) next = descs[next_index];
    if (((cur.src | cur.dst | cur.bytes) & 15) == 0) {
      CopyVector(reinterpret_cast<const uint4*>(cur.src), reinterpret_cast<uint4*>(cur.dst),
                 cur.bytes >> 4, lane);
    } else {
      const unsigned char* s = reinterpret_cast<const unsigned char*>(cur.src);
      unsigned char* t = reinterpret_cast<unsigned char*>(cur.dst);
      for (uint64_t i = lane; i < cur.bytes; i += 32) t[i] = s[i];
    }
    if (next_index >= count) break;
    d = next_index;
    cur = next;
  }
}

__global__ void DelayedFillKernel(unsigned char* dst, uint64_t bytes, uint32_t seed,
                                  uint64_t delay_ns) {
  if (delay_ns > 0) {
    uint64_t start = 0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    uint64_t now = start;
    while (now - start < delay_ns) {
      __nanosleep(1000);
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    }
  }
  uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < bytes;
       i += stride) {
    dst[i] = static_cast<unsigned char>((seed + i * 2654435761u) >> 7);
  }
}

__global__ void BusyKernel(float* sink, int iters) {
  float a = threadIdx.x * 1e-3f, b = 1.0001f, c = 0.9999f, e = 0.5f;
  for (int i = 0; i < iters; ++i) {
    a = fmaf(a, b, c);
    e = fmaf(e, c, b);
    b = fmaf(b, 0.99999f, 1e-7f);
  }
  sink[static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x] = a + e;
}

}  // namespace

cudaError_t LaunchCopyPieces(const CopyDesc* descs, size_t count, int ctas, int threads,
                             cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  uint64_t warps_needed = count;
  uint64_t max_ctas = (warps_needed * 32 + threads - 1) / threads;
  int grid = static_cast<int>(max_ctas < static_cast<uint64_t>(ctas) ? max_ctas : ctas);
  CopyPiecesKernel<<<grid, threads, 0, stream>>>(descs, count);
  return cudaGetLastError();
}

cudaError_t LaunchDelayedFill(void* dst, size_t bytes, uint32_t seed, uint64_t delay_ns,
                              cudaStream_t stream) {
  DelayedFillKernel<<<264, 256, 0, stream>>>(static_cast<unsigned char*>(dst), bytes, seed,
                                             delay_ns);
  return cudaGetLastError();
}

cudaError_t LaunchBusyKernel(float* sink, int ctas, int iters, cudaStream_t stream) {
  BusyKernel<<<ctas, 256, 0, stream>>>(sink, iters);
  return cudaGetLastError();
}

}  // namespace kvo::cuda_internal
