// One piece of a copy as kvo's gather/scatter kernels read it (transfer/cuda): `bytes` from `src`
// to `dst`, device-usable addresses. 32 bytes so a warp reads it in one go. A plain header (C++17,
// no CUDA) so the CUDA-free staging planner (staging_plan.h) writes what the kernels read.
#pragma once

#include <cstdint>

namespace kvo {

struct PieceDesc {
  uint64_t src;
  uint64_t dst;
  uint64_t bytes;
  uint64_t pad;
};
static_assert(sizeof(PieceDesc) == 32, "PieceDesc is read as 32 bytes by the copy kernels");

}  // namespace kvo
