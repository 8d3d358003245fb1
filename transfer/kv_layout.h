// KV layout registration (vllm-compat.md B.10): where the engine's KV cache lives on the "GPU"
// side (per tensor: base address, number of blocks, block stride, page bytes; per KV group: which
// tensors it uses and how many unpadded bytes of each page are copied) and vLLM's CPU row layout:
//
//   host region = num_slots rows of row_stride bytes (row_stride = kv_bytes_per_chunk rounded up
//                 to host_page_size); one row per CPU slot holds one offloaded chunk.
//   row         = [worker 0 | worker 1 | ... | worker W-1 | zero padding]
//   worker cell = [tensor 0 area | tensor 1 area | ...]     (cell_bytes = sum page_bytes * bpc)
//   tensor area = blocks_per_chunk pages of page_bytes, the chunk's GPU pages back to back; a
//                 group's ref copies only its unpadded copy_bytes of each page.
//
// A block-level spec (vLLM's GPULoadStoreSpec + CPULoadStoreSpec) names GPU blocks per group and
// the CPU slots of their chunks; ExpandBlockSpec turns it into copy segments (used by every
// engine). Partial chunks (B.10): block_indices[g] % blocks_per_chunk GPU sub-blocks are skipped
// at the start of group g's first chunk; a short last chunk copies only the blocks it has.
//
// Value types; KvLayout is immutable after Create and safe to share between threads.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/result.h"
#include "common/status.h"

namespace kvo {

enum class TransferDirection : uint8_t {
  kGpuToCpu = 0,  // offload (store)
  kCpuToGpu = 1,  // load
};
std::string_view TransferDirectionName(TransferDirection d);  // "gpu_to_cpu" | "cpu_to_gpu"

// One copy: `bytes` from src to dst. Addresses are raw (device or host) addresses.
struct CopySegment {
  uintptr_t src = 0;
  uintptr_t dst = 0;
  uint64_t bytes = 0;
  friend bool operator==(const CopySegment&, const CopySegment&) = default;
};

// One (deduplicated) KV tensor viewed as (num_blocks, block_stride) bytes, vLLM's
// CanonicalKVCacheTensor. page_bytes <= block_stride is the tensor's page (its area in a CPU
// cell is page_bytes * blocks_per_chunk).
struct KvTensorLayout {
  uintptr_t base = 0;         // address of block 0 (device memory for the CUDA engine)
  uint64_t num_blocks = 0;    // GPU blocks
  uint64_t block_stride = 0;  // bytes between consecutive blocks
  uint64_t page_bytes = 0;    // bytes of one page (block), padded
};

// A KV group's reference to a tensor: vLLM's CanonicalKVCacheRef(tensor_idx, page_size_bytes).
struct KvGroupRef {
  uint32_t tensor_index = 0;
  uint64_t copy_bytes = 0;  // unpadded page bytes actually copied (<= page_bytes)
};

struct KvGroupLayout {
  std::vector<KvGroupRef> refs;
};

struct KvLayoutSpec {
  std::vector<KvTensorLayout> tensors;
  std::vector<KvGroupLayout> groups;
  uint32_t blocks_per_chunk = 1;   // GPU blocks per CPU slot (offloaded chunk)
  uint32_t num_workers = 1;        // worker cells per row (vLLM num_copies: world size, 1 for MLA)
  uint32_t worker_index = 0;       // this worker's cell (device index % world size)
  uint64_t host_page_size = 4096;  // row alignment (vLLM: mmap.PAGESIZE)
  // Required alignment of every address and copy size (e.g. 16 for a 16-byte-access kernel);
  // 1 accepts anything.
  uint64_t alignment = 1;
};

// The CPU side: num_slots rows of row_stride bytes starting at base (host memory, ideally pinned
// and page-aligned).
struct HostRegion {
  uintptr_t base = 0;
  uint64_t num_slots = 0;
  uint64_t row_stride = 0;
  uint64_t bytes() const { return num_slots * row_stride; }
};

// Which GPU blocks of each group move to/from which CPU slots (vLLM GPULoadStoreSpec +
// CPULoadStoreSpec). Blocks and slots are ordered by group; group_sizes / block_indices have one
// entry per KV group. Group g's blocks cover chunk positions skip_g .. skip_g + n_g - 1 with
// skip_g = block_indices[g] % blocks_per_chunk; it uses ceil((skip_g + n_g) / bpc) slots (0 when
// n_g == 0).
// The order ExpandBlockSpec emits segments in (the same set either way).
enum class ExpandOrder : uint8_t {
  // group, ref, block: one run per (group, ref), ordered by block position.
  kGroupRefBlock,
  // group, CPU slot (chunk), ref by its tensor area's offset in the row, block position: each
  // row's segments are emitted in host-address order, back to back, so a row is one
  // host-contiguous span when the refs copy whole pages of adjacent areas, and a job whose slots
  // ascend is ordered by host address without sorting (the CUDA engine's staging path).
  kHostRow,
};

struct BlockTransferSpec {
  std::vector<int64_t> gpu_block_ids;
  std::vector<uint32_t> group_sizes;
  std::vector<uint64_t> block_indices;  // empty: all zero
  std::vector<int64_t> cpu_slots;
};

class HostRowExpander;

class KvLayout {
 public:
  // Validates the spec: non-empty tensors and groups, nonzero sizes, page_bytes <= block_stride,
  // copy_bytes <= page_bytes, tensor indices in range, alignment of bases/strides/sizes,
  // worker_index < num_workers, blocks_per_chunk >= 1, no arithmetic overflow. Errors name the
  // tensor / group / field.
  static Result<KvLayout> Create(KvLayoutSpec spec);

  const KvLayoutSpec& spec() const { return spec_; }
  uint64_t cell_bytes() const { return cell_bytes_; }           // one worker's bytes per row
  uint64_t kv_bytes_per_chunk() const { return chunk_bytes_; }  // cell_bytes * num_workers
  uint64_t row_stride() const { return row_stride_; }           // rounded up to host_page_size
  // Offset, inside a row, of this worker's area for `tensor_index` (sub-block 0).
  uint64_t TensorAreaOffset(uint32_t tensor_index) const;

  // A HostRegion of this layout's row stride over [base, base + bytes); errors when base is not
  // aligned to `alignment` or fewer than one row fits.
  Result<HostRegion> MakeHostRegion(uintptr_t base, uint64_t bytes) const;
  // Checks that `region` matches this layout (row_stride, alignment).
  Status CheckHostRegion(const HostRegion& region) const;

  // Expands a block-level spec into segments for `direction` (src/dst swap with the direction),
  // in `order`. With `coalesce`, segments contiguous on both sides are merged. Errors (nothing
  // appended):
  // group_sizes size != number of groups, block/slot counts that do not add up, a block id
  // outside its tensor, a slot id outside the region.
  Status ExpandBlockSpec(const BlockTransferSpec& spec, const HostRegion& region,
                         TransferDirection direction, bool coalesce, std::vector<CopySegment>* out,
                         ExpandOrder order = ExpandOrder::kGroupRefBlock) const;

  // Number of CPU slots a group with `num_blocks` GPU blocks starting at logical `block_index`
  // uses.
  uint64_t SlotsForGroup(uint64_t num_blocks, uint64_t block_index) const;

 private:
  friend class HostRowExpander;
  explicit KvLayout(KvLayoutSpec spec) : spec_(std::move(spec)) {}
  // What every expansion of `spec` checks before it generates anything: `region` matches, one
  // size (and index, if any) per KV group, block ids and CPU slots that add up, every slot inside
  // `region`.
  Status CheckBlockSpec(const BlockTransferSpec& spec, const HostRegion& region) const;

  KvLayoutSpec spec_;
  std::vector<uint64_t> tensor_area_offset_;  // within a worker cell
  // Per group: its ref indices ordered by tensor area offset (ExpandOrder::kHostRow).
  std::vector<std::vector<uint32_t>> host_ref_order_;
  uint64_t cell_bytes_ = 0;
  uint64_t chunk_bytes_ = 0;
  uint64_t row_stride_ = 0;
};

// A block spec expanded incrementally, for the CUDA staging submit (issue 15): Begin checks the
// whole spec up front in O(blocks + slots) — the same checks and errors as ExpandBlockSpec, every
// block id against every tensor its group names included — and orders the job's rows (one per
// (group, chunk): its CPU slot) by host address (a linear check; a stable radix sort of the rows,
// not of the segments, only when the slots do not ascend). Fill then generates the segments a few
// at a time in host order: rows by slot, each row as ExpandOrder::kHostRow emits it, merged on the
// fly when contiguous on both sides (CoalesceSegments over the whole stream). Nothing Fill produces
// can be invalid once Begin succeeded: copy_bytes > 0, tensors and the region fit the address space
// (KvLayout::Create, CheckHostRegion) and every block and slot is in range (Begin), so each
// segment lies inside one tensor and one row (what ValidateSegments would check is implied). A job
// that has a bad block anywhere therefore fails at Begin, before anything is enqueued.
// The layout and the spec must outlive the expansion. Reusable (buffers keep their capacity).
class HostRowExpander {
 public:
  Status Begin(const KvLayout& layout, const BlockTransferSpec& spec, const HostRegion& region,
               TransferDirection direction);
  uint64_t total_bytes() const { return total_bytes_; }
  // Segments before merging (one per (block, ref)).
  uint64_t segments() const { return segments_; }
  // Upper bound of the kernel pieces of `piece_bytes` the segments split into (merged or not).
  uint64_t MaxPieces(uint64_t piece_bytes) const;
  // Whether Begin had to sort the rows (CPU slots not ascending).
  bool sorted_rows() const { return sorted_rows_; }
  // Appends the next segments, at least `min_bytes` of them unless the job ends first; returns
  // the bytes appended.
  uint64_t Fill(std::vector<CopySegment>* out, uint64_t min_bytes);
  bool done() const { return done_; }
  // The number of merged segments of the whole job, counted without storing them, stopping once
  // it exceeds `cap` (then cap + 1).
  uint64_t CountSegments(uint64_t cap) const;

 private:
  struct Row {
    uint64_t slot;
    uint32_t group;
    uint32_t chunk;  // of its group
  };
  struct Group {
    size_t block_pos;  // first block id of the group in spec.gpu_block_ids
    uint64_t skip;     // positions skipped in its first chunk
    uint64_t n;        // blocks
  };
  struct State {
    size_t row = 0;
    size_t ref = 0;  // index into the group's host ref order
    uint64_t i = 0;  // position within the (row, ref) run
  };
  // Generates segments from *st on, calling sink(segment) until it returns false (then true:
  // more may follow) or the job ends (false).
  template <bool kD2h, typename Sink>
  bool Run(State* st, Sink&& sink) const;

  const KvLayout* layout_ = nullptr;
  const BlockTransferSpec* spec_ = nullptr;
  HostRegion region_;
  bool d2h_ = true;
  uint64_t total_bytes_ = 0;
  uint64_t segments_ = 0;
  bool sorted_rows_ = false;
  std::vector<Group> groups_;
  std::vector<Row> rows_;
  std::vector<Row> sorted_;  // sort scratch
  State state_;
  CopySegment pending_;
  bool has_pending_ = false;
  bool done_ = true;
};

// Checks raw segments: nonzero sizes, no address overflow, alignment (errors name the segment).
Status ValidateSegments(std::span<const CopySegment> segments, uint64_t alignment);

// Merges segments contiguous on both sides (in order; no reordering), from index `first` on (the
// segments before it are left as they are).
void CoalesceSegments(std::vector<CopySegment>* segments, size_t first = 0);

}  // namespace kvo
