// The host side of the CUDA engine's staging method, free of CUDA so it is tested and measured on
// any machine (`kvo bench transfer`, case staging_plan_*): ordering a job's segments by host
// address and cutting them into staging chunks of kernel descriptors plus contiguous host runs.
//
//   OrderByHost      segments -> host-address order. Linear when the job is already ordered at the
//                    granularity of host-contiguous spans (a block spec expanded in
//                    ExpandOrder::kHostRow with ascending CPU slots: one check, no move); else the
//                    spans (not the segments) are sorted and the segments gathered once.
//   StagingPlanner   chunk by chunk (so the engine launches chunk i while it plans chunk i+1):
//                    descriptors written straight into the caller's buffer (the engine's pinned
//                    descriptor block) with final staging addresses; host runs merged on the fly.
//                    No allocation once its run vector has grown. Fed either the whole job's
//                    segments (a span) or a HostRowExpander (kv_layout.h) that it asks for the
//                    segments of each chunk as it plans it: then the GPU can start on chunk 0
//                    after chunk 0's expansion, not the whole job's (issue 15).
//
// Chunk sizes ramp: the first and the last chunk are chunk_bytes / 8 (so the gather that cannot
// overlap a DMA, D2H, or the scatter, H2D, is short), the others chunk_bytes. Staging slots
// alternate from `first_slot`.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "transfer/kv_layout.h"
#include "transfer/piece_desc.h"

namespace kvo {

// Reusable buffers of OrderByHost (keep one per engine: no allocation once grown).
struct HostOrderScratch {
  struct Span {
    uintptr_t host;  // host address of the span's first byte
    uint32_t first;  // index of its first segment
    uint32_t count;  // segments
  };
  std::vector<Span> spans;
  std::vector<CopySegment> segments;
};

// Orders `segments` by host address (dst for d2h, src otherwise), keeping runs of segments that
// are host-contiguous in their order. Returns the number of host-contiguous spans (1: the host side
// is one run). InvalidArgument beyond 2^32 segments.
Result<size_t> OrderByHost(std::vector<CopySegment>* segments, bool d2h, HostOrderScratch* scratch);

// A contiguous host range of a chunk and where it sits in the staging buffer.
struct StagingRun {
  uintptr_t host;
  uint64_t offset;  // in the chunk's staging slot
  uint64_t bytes;
};

// One planned chunk: descriptors [desc_begin, desc_end) of the caller's buffer, `slot` (0 or 1).
struct StagingChunk {
  size_t desc_begin = 0;
  size_t desc_end = 0;
  uint32_t slot = 0;
};

class StagingPlanner {
 public:
  struct Params {
    uint64_t chunk_bytes = 16ull << 20;  // one staging slot
    uint64_t piece_bytes = 64 << 10;     // a kernel descriptor's largest piece
    std::array<uintptr_t, 2> staging{};  // device addresses of the two slots
    uint64_t first_slot = 0;             // slot of chunk 0 is first_slot % 2
    bool d2h = true;
  };

  // Descriptors a job needs at most: one per started piece of each segment, plus one per chunk
  // (a chunk boundary splits at most one piece).
  static size_t MaxDescs(std::span<const CopySegment> segments, uint64_t total_bytes,
                         const Params& params);
  // The same bound from a count of pieces (HostRowExpander::MaxPieces(params.piece_bytes)).
  static size_t MaxDescs(uint64_t max_pieces, uint64_t total_bytes, const Params& params);
  // Number of chunks of a job of `total_bytes`.
  static size_t ChunkCount(uint64_t total_bytes, uint64_t chunk_bytes);

  // Starts a job: `segments` (host-ordered for the fewest runs; any order is correct) of
  // `total_bytes` bytes; descriptors go to descs[0, capacity) (capacity >= MaxDescs).
  void Begin(std::span<const CopySegment> segments, uint64_t total_bytes, const Params& params,
             PieceDesc* descs, size_t capacity);
  // Starts a job whose segments `source` generates (Begin already succeeded on it; total_bytes =
  // source->total_bytes()): each Next asks it for the bytes of that chunk, so a chunk is planned
  // after its own segments were generated. The source must outlive the job's planning.
  void Begin(HostRowExpander* source, uint64_t total_bytes, const Params& params, PieceDesc* descs,
             size_t capacity);
  // Plans the next chunk; false when every byte is planned (or the buffer would overflow: then
  // overflowed() is true, a caller bug).
  bool Next(StagingChunk* chunk);
  // The host runs of the chunk Next just planned.
  std::span<const StagingRun> runs() const { return runs_; }
  bool overflowed() const { return overflowed_; }
  size_t descs_used() const { return used_; }

 private:
  std::span<const CopySegment> segs_;
  HostRowExpander* source_ = nullptr;
  std::vector<CopySegment> window_;  // the source's segments not yet planned
  Params p_;
  PieceDesc* descs_ = nullptr;
  size_t capacity_ = 0;
  size_t used_ = 0;
  size_t seg_ = 0;     // next segment
  uint64_t done_ = 0;  // bytes of segs_[seg_] already planned
  uint64_t remaining_ = 0;
  uint64_t chunk_index_ = 0;
  bool overflowed_ = false;
  std::vector<StagingRun> runs_;
};

}  // namespace kvo
