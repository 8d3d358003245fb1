#include "transfer/kv_layout.h"

#include <algorithm>
#include <array>
#include <limits>
#include <string>

namespace kvo {
namespace {

bool MulOverflows(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}
bool AddOverflows(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_add_overflow(a, b, out);
}

std::string T(size_t i) { return "tensor " + std::to_string(i); }

}  // namespace

std::string_view TransferDirectionName(TransferDirection d) {
  return d == TransferDirection::kGpuToCpu ? "gpu_to_cpu" : "cpu_to_gpu";
}

Result<KvLayout> KvLayout::Create(KvLayoutSpec spec) {
  if (spec.tensors.empty()) return Status::InvalidArgument("kv layout: no tensors");
  if (spec.groups.empty()) return Status::InvalidArgument("kv layout: no KV groups");
  if (spec.blocks_per_chunk == 0) {
    return Status::InvalidArgument("kv layout: blocks_per_chunk must be >= 1, got 0");
  }
  if (spec.num_workers == 0) return Status::InvalidArgument("kv layout: num_workers must be >= 1");
  if (spec.worker_index >= spec.num_workers) {
    return Status::InvalidArgument("kv layout: worker_index " + std::to_string(spec.worker_index) +
                                   " out of range for num_workers " +
                                   std::to_string(spec.num_workers));
  }
  if (spec.alignment == 0 || (spec.alignment & (spec.alignment - 1)) != 0) {
    return Status::InvalidArgument("kv layout: alignment must be a power of two, got " +
                                   std::to_string(spec.alignment));
  }
  if (spec.host_page_size == 0 || spec.host_page_size % spec.alignment != 0) {
    return Status::InvalidArgument("kv layout: host_page_size " +
                                   std::to_string(spec.host_page_size) +
                                   " must be a nonzero multiple of the alignment");
  }
  const uint64_t a = spec.alignment;
  KvLayout layout(spec);
  uint64_t cell = 0;
  for (size_t i = 0; i < spec.tensors.size(); ++i) {
    const KvTensorLayout& t = spec.tensors[i];
    if (t.base == 0) return Status::InvalidArgument("kv layout: " + T(i) + " has a null base");
    if (t.num_blocks == 0 || t.block_stride == 0 || t.page_bytes == 0) {
      return Status::InvalidArgument("kv layout: " + T(i) +
                                     " has a zero num_blocks, block_stride or page_bytes");
    }
    if (t.page_bytes > t.block_stride) {
      return Status::InvalidArgument("kv layout: " + T(i) + " page_bytes " +
                                     std::to_string(t.page_bytes) + " exceeds block_stride " +
                                     std::to_string(t.block_stride));
    }
    if (t.base % a != 0 || t.block_stride % a != 0 || t.page_bytes % a != 0) {
      return Status::InvalidArgument("kv layout: " + T(i) + " base, block_stride or page_bytes" +
                                     " not aligned to " + std::to_string(a) + " bytes");
    }
    uint64_t span = 0, end = 0;
    if (MulOverflows(t.num_blocks - 1, t.block_stride, &span) ||
        AddOverflows(span, t.page_bytes, &span) || AddOverflows(t.base, span, &end)) {
      return Status::InvalidArgument("kv layout: " + T(i) + " extends beyond the address space");
    }
    layout.tensor_area_offset_.push_back(cell);
    uint64_t area = 0;
    if (MulOverflows(t.page_bytes, spec.blocks_per_chunk, &area) ||
        AddOverflows(cell, area, &cell)) {
      return Status::InvalidArgument("kv layout: row size overflows at " + T(i));
    }
  }
  for (size_t g = 0; g < spec.groups.size(); ++g) {
    const KvGroupLayout& group = spec.groups[g];
    if (group.refs.empty()) {
      return Status::InvalidArgument("kv layout: group " + std::to_string(g) + " has no tensors");
    }
    for (size_t r = 0; r < group.refs.size(); ++r) {
      const KvGroupRef& ref = group.refs[r];
      std::string where = "kv layout: group " + std::to_string(g) + " ref " + std::to_string(r);
      if (ref.tensor_index >= spec.tensors.size()) {
        return Status::InvalidArgument(where + " names tensor " + std::to_string(ref.tensor_index) +
                                       " of " + std::to_string(spec.tensors.size()));
      }
      if (ref.copy_bytes == 0) return Status::InvalidArgument(where + " copies zero bytes");
      if (ref.copy_bytes > spec.tensors[ref.tensor_index].page_bytes) {
        return Status::InvalidArgument(where + " copy_bytes " + std::to_string(ref.copy_bytes) +
                                       " exceeds the tensor's page_bytes " +
                                       std::to_string(spec.tensors[ref.tensor_index].page_bytes));
      }
      if (ref.copy_bytes % a != 0) {
        return Status::InvalidArgument(where + " copy_bytes not aligned to " + std::to_string(a));
      }
    }
  }
  layout.cell_bytes_ = cell;
  layout.host_ref_order_.resize(spec.groups.size());
  for (size_t g = 0; g < spec.groups.size(); ++g) {
    std::vector<uint32_t>& order = layout.host_ref_order_[g];
    const std::vector<KvGroupRef>& refs = spec.groups[g].refs;
    for (uint32_t r = 0; r < refs.size(); ++r) order.push_back(r);
    std::stable_sort(order.begin(), order.end(), [&](uint32_t x, uint32_t y) {
      return layout.tensor_area_offset_[refs[x].tensor_index] <
             layout.tensor_area_offset_[refs[y].tensor_index];
    });
  }
  uint64_t chunk = 0, rounded = 0;
  if (MulOverflows(cell, spec.num_workers, &chunk) ||
      AddOverflows(chunk, spec.host_page_size - 1, &rounded)) {
    return Status::InvalidArgument("kv layout: row size overflows");
  }
  layout.chunk_bytes_ = chunk;
  layout.row_stride_ = rounded / spec.host_page_size * spec.host_page_size;
  layout.spec_ = std::move(spec);
  return layout;
}

uint64_t KvLayout::TensorAreaOffset(uint32_t tensor_index) const {
  return cell_bytes_ * spec_.worker_index + tensor_area_offset_.at(tensor_index);
}

uint64_t KvLayout::SlotsForGroup(uint64_t num_blocks, uint64_t block_index) const {
  if (num_blocks == 0) return 0;
  const uint64_t bpc = spec_.blocks_per_chunk;
  return (block_index % bpc + num_blocks + bpc - 1) / bpc;
}

Result<HostRegion> KvLayout::MakeHostRegion(uintptr_t base, uint64_t bytes) const {
  HostRegion r{base, bytes / row_stride_, row_stride_};
  KVO_RETURN_IF_ERROR(CheckHostRegion(r));
  return r;
}

Status KvLayout::CheckHostRegion(const HostRegion& region) const {
  if (region.base == 0) return Status::InvalidArgument("host region: null base");
  if (region.num_slots == 0) {
    return Status::InvalidArgument("host region: holds no row of " + std::to_string(row_stride_) +
                                   " bytes");
  }
  if (region.row_stride != row_stride_) {
    return Status::InvalidArgument("host region: row_stride " + std::to_string(region.row_stride) +
                                   " differs from the layout's " + std::to_string(row_stride_));
  }
  if (region.base % spec_.alignment != 0) {
    return Status::InvalidArgument("host region: base not aligned to " +
                                   std::to_string(spec_.alignment) + " bytes");
  }
  uint64_t bytes = 0, end = 0;
  if (MulOverflows(region.num_slots, region.row_stride, &bytes) ||
      AddOverflows(region.base, bytes, &end)) {
    return Status::InvalidArgument("host region: extends beyond the address space");
  }
  return Status::Ok();
}

Status KvLayout::CheckBlockSpec(const BlockTransferSpec& spec, const HostRegion& region) const {
  KVO_RETURN_IF_ERROR(CheckHostRegion(region));
  const size_t num_groups = spec_.groups.size();
  if (spec.group_sizes.size() != num_groups) {
    return Status::InvalidArgument("block spec: " + std::to_string(spec.group_sizes.size()) +
                                   " group sizes for " + std::to_string(num_groups) + " KV groups");
  }
  if (!spec.block_indices.empty() && spec.block_indices.size() != num_groups) {
    return Status::InvalidArgument("block spec: " + std::to_string(spec.block_indices.size()) +
                                   " block indices for " + std::to_string(num_groups) +
                                   " KV groups");
  }
  uint64_t total_blocks = 0, total_slots = 0;
  for (size_t g = 0; g < num_groups; ++g) {
    total_blocks += spec.group_sizes[g];
    total_slots +=
        SlotsForGroup(spec.group_sizes[g], spec.block_indices.empty() ? 0 : spec.block_indices[g]);
  }
  if (total_blocks != spec.gpu_block_ids.size()) {
    return Status::InvalidArgument("block spec: group sizes add up to " +
                                   std::to_string(total_blocks) + " blocks but " +
                                   std::to_string(spec.gpu_block_ids.size()) + " block ids given");
  }
  if (total_slots != spec.cpu_slots.size()) {
    return Status::InvalidArgument("block spec: the groups' chunks need " +
                                   std::to_string(total_slots) + " CPU slots but " +
                                   std::to_string(spec.cpu_slots.size()) + " given");
  }
  for (int64_t slot : spec.cpu_slots) {
    if (slot < 0 || static_cast<uint64_t>(slot) >= region.num_slots) {
      return Status::OutOfRange("block spec: CPU slot " + std::to_string(slot) +
                                " out of range [0, " + std::to_string(region.num_slots) + ")");
    }
  }
  return Status::Ok();
}

Status KvLayout::ExpandBlockSpec(const BlockTransferSpec& spec, const HostRegion& region,
                                 TransferDirection direction, bool coalesce,
                                 std::vector<CopySegment>* out, ExpandOrder order) const {
  KVO_RETURN_IF_ERROR(CheckBlockSpec(spec, region));
  const size_t num_groups = spec_.groups.size();
  const size_t first = out->size();
  size_t total_refs = 0;
  for (size_t g = 0; g < num_groups; ++g)
    total_refs += spec_.groups[g].refs.size() * spec.group_sizes[g];
  out->reserve(first + total_refs);
  const uint64_t bpc = spec_.blocks_per_chunk;
  const bool d2h = direction == TransferDirection::kGpuToCpu;
  const uint64_t worker_offset = cell_bytes_ * spec_.worker_index;
  // One segment of group g: block position `pos` of its chunks, ref `ref`; false when the
  // block id is outside the ref's tensor (the caller then reports it; no Status per segment).
  auto emit = [&](const KvGroupRef& ref, size_t block_pos, size_t slot_pos, uint64_t skip,
                  uint64_t pos) -> bool {
    const KvTensorLayout& t = spec_.tensors[ref.tensor_index];
    const int64_t block = spec.gpu_block_ids[block_pos + (pos - skip)];
    if (block < 0 || static_cast<uint64_t>(block) >= t.num_blocks) return false;
    const uint64_t slot = static_cast<uint64_t>(spec.cpu_slots[slot_pos + pos / bpc]);
    const uintptr_t gpu = t.base + static_cast<uint64_t>(block) * t.block_stride;
    const uintptr_t cpu = region.base + slot * region.row_stride + worker_offset +
                          tensor_area_offset_[ref.tensor_index] + (pos % bpc) * t.page_bytes;
    if (d2h) {
      out->push_back({gpu, cpu, ref.copy_bytes});
    } else {
      out->push_back({cpu, gpu, ref.copy_bytes});
    }
    return true;
  };
  auto bad_block = [&](size_t g, const KvGroupRef& ref, size_t block_pos, uint64_t skip,
                       uint64_t pos) {
    out->resize(first);
    const int64_t block = spec.gpu_block_ids[block_pos + (pos - skip)];
    return Status::OutOfRange(
        "block spec: GPU block " + std::to_string(block) + " of group " + std::to_string(g) +
        " outside tensor " + std::to_string(ref.tensor_index) + " (" +
        std::to_string(spec_.tensors[ref.tensor_index].num_blocks) + " blocks)");
  };
  size_t block_pos = 0, slot_pos = 0;
  for (size_t g = 0; g < num_groups; ++g) {
    const uint64_t n = spec.group_sizes[g];
    const uint64_t block_index = spec.block_indices.empty() ? 0 : spec.block_indices[g];
    const uint64_t skip = block_index % bpc;
    const std::vector<KvGroupRef>& refs = spec_.groups[g].refs;
    if (order == ExpandOrder::kGroupRefBlock) {
      for (const KvGroupRef& ref : refs) {
        for (uint64_t pos = skip; pos < skip + n; ++pos) {
          if (!emit(ref, block_pos, slot_pos, skip, pos)) {
            return bad_block(g, ref, block_pos, skip, pos);
          }
        }
      }
    } else {
      // Per chunk: its row; per ref: its tensor and area; per block: a bound check and two
      // multiply-adds (no division per segment).
      const uint64_t chunks = SlotsForGroup(n, block_index);
      for (uint64_t c = 0; c < chunks; ++c) {
        const uint64_t pos_begin = std::max(skip, c * bpc);
        const uint64_t pos_end = std::min(skip + n, (c + 1) * bpc);
        const uintptr_t row =
            region.base + static_cast<uint64_t>(spec.cpu_slots[slot_pos + c]) * region.row_stride +
            worker_offset;
        for (uint32_t r : host_ref_order_[g]) {
          const KvGroupRef& ref = refs[r];
          const KvTensorLayout& t = spec_.tensors[ref.tensor_index];
          uintptr_t cpu =
              row + tensor_area_offset_[ref.tensor_index] + (pos_begin - c * bpc) * t.page_bytes;
          const int64_t* ids = spec.gpu_block_ids.data() + block_pos - skip;
          for (uint64_t pos = pos_begin; pos < pos_end; ++pos, cpu += t.page_bytes) {
            const int64_t block = ids[pos];
            if (block < 0 || static_cast<uint64_t>(block) >= t.num_blocks) {
              return bad_block(g, ref, block_pos, skip, pos);
            }
            const uintptr_t gpu = t.base + static_cast<uint64_t>(block) * t.block_stride;
            if (d2h) {
              out->push_back({gpu, cpu, ref.copy_bytes});
            } else {
              out->push_back({cpu, gpu, ref.copy_bytes});
            }
          }
        }
      }
    }
    block_pos += n;
    slot_pos += SlotsForGroup(n, block_index);
  }
  if (coalesce) CoalesceSegments(out, first);
  return Status::Ok();
}

Status HostRowExpander::Begin(const KvLayout& layout, const BlockTransferSpec& spec,
                              const HostRegion& region, TransferDirection direction) {
  done_ = true;
  has_pending_ = false;
  state_ = State{};
  groups_.clear();
  rows_.clear();
  total_bytes_ = segments_ = 0;
  sorted_rows_ = false;
  KVO_RETURN_IF_ERROR(layout.CheckBlockSpec(spec, region));
  const KvLayoutSpec& ls = layout.spec_;
  const size_t num_groups = ls.groups.size();
  const uint64_t bpc = ls.blocks_per_chunk;
  uint64_t total_blocks = 0;
  for (size_t g = 0; g < num_groups; ++g) {
    const uint64_t index = spec.block_indices.empty() ? 0 : spec.block_indices[g];
    groups_.push_back({static_cast<size_t>(total_blocks), index % bpc, spec.group_sizes[g]});
    total_blocks += spec.group_sizes[g];
  }
  // Every block id of the job against the smallest tensor its group names: O(blocks), before
  // anything is generated (a bad id in the last chunk fails the job here, not midway).
  uint64_t total = 0;
  for (size_t g = 0; g < num_groups; ++g) {
    const Group& gi = groups_[g];
    uint64_t min_blocks = UINT64_MAX, copy = 0;
    for (const KvGroupRef& ref : ls.groups[g].refs) {
      min_blocks = std::min(min_blocks, ls.tensors[ref.tensor_index].num_blocks);
      copy += ref.copy_bytes;  // <= the row's cell: no overflow
    }
    const int64_t* ids = spec.gpu_block_ids.data() + gi.block_pos;
    for (uint64_t i = 0; i < gi.n; ++i) {
      const int64_t block = ids[i];
      if (block >= 0 && static_cast<uint64_t>(block) < min_blocks) continue;
      // The first ref, in emission order, whose tensor does not hold the block (ExpandBlockSpec's
      // message).
      for (uint32_t r : layout.host_ref_order_[g]) {
        const KvGroupRef& ref = ls.groups[g].refs[r];
        const uint64_t nb = ls.tensors[ref.tensor_index].num_blocks;
        if (block < 0 || static_cast<uint64_t>(block) >= nb) {
          return Status::OutOfRange("block spec: GPU block " + std::to_string(block) +
                                    " of group " + std::to_string(g) + " outside tensor " +
                                    std::to_string(ref.tensor_index) + " (" + std::to_string(nb) +
                                    " blocks)");
        }
      }
    }
    uint64_t bytes = 0;
    if (__builtin_mul_overflow(copy, gi.n, &bytes) ||
        __builtin_add_overflow(total, bytes, &total)) {
      return Status::InvalidArgument("block spec: job bytes overflow");
    }
    segments_ += ls.groups[g].refs.size() * gi.n;
  }
  // Rows in spec order (group, chunk); sorted by slot only when the slots do not ascend.
  size_t slot_pos = 0;
  bool ascending = true;
  for (size_t g = 0; g < num_groups; ++g) {
    const uint64_t index = spec.block_indices.empty() ? 0 : spec.block_indices[g];
    const uint64_t chunks = layout.SlotsForGroup(groups_[g].n, index);
    for (uint64_t c = 0; c < chunks; ++c) {
      const uint64_t slot = static_cast<uint64_t>(spec.cpu_slots[slot_pos + c]);
      ascending &= rows_.empty() || rows_.back().slot <= slot;
      rows_.push_back({slot, static_cast<uint32_t>(g), static_cast<uint32_t>(c)});
    }
    slot_pos += chunks;
  }
  if (!ascending) {
    // Ties keep the spec order (group, chunk), as OrderByHost keeps equal addresses in order.
    // A stable LSD radix sort on the slot, 8 bits a pass over the bits a slot of the region can
    // have (2 passes for up to 65 536 slots): linear, where a comparison sort of a few thousand
    // rows cost ~150 us of the time to the first chunk (bench staging_plan_first_chunk_*).
    uint32_t bits = 0;
    while (bits < 64 && ((region.num_slots - 1) >> bits) != 0) bits += 8;
    sorted_.resize(rows_.size());
    for (uint32_t shift = 0; shift < bits; shift += 8) {
      std::array<size_t, 257> start{};
      for (const Row& r : rows_) ++start[((r.slot >> shift) & 0xff) + 1];
      for (size_t d = 1; d < start.size(); ++d) start[d] += start[d - 1];
      for (const Row& r : rows_) sorted_[start[(r.slot >> shift) & 0xff]++] = r;
      rows_.swap(sorted_);
    }
    sorted_rows_ = true;
  }
  layout_ = &layout;
  spec_ = &spec;
  region_ = region;
  d2h_ = direction == TransferDirection::kGpuToCpu;
  total_bytes_ = total;
  done_ = rows_.empty();
  return Status::Ok();
}

uint64_t HostRowExpander::MaxPieces(uint64_t piece_bytes) const {
  if (layout_ == nullptr || piece_bytes == 0) return 0;
  const KvLayoutSpec& ls = layout_->spec_;
  uint64_t pieces = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    uint64_t per_block = 0;
    for (const KvGroupRef& ref : ls.groups[g].refs) {
      per_block += (ref.copy_bytes + piece_bytes - 1) / piece_bytes;
    }
    pieces += per_block * groups_[g].n;
  }
  return pieces;
}

template <bool kD2h, typename Sink>
bool HostRowExpander::Run(State* st, Sink&& sink) const {
  const KvLayoutSpec& ls = layout_->spec_;
  const uint64_t bpc = ls.blocks_per_chunk;
  const uintptr_t worker = layout_->cell_bytes_ * ls.worker_index;
  for (; st->row < rows_.size(); ++st->row, st->ref = 0) {
    const Row& row = rows_[st->row];
    const Group& gi = groups_[row.group];
    const uint64_t c = row.chunk;
    const uint64_t pos_begin = std::max(gi.skip, c * bpc);
    const uint64_t pos_end = std::min(gi.skip + gi.n, (c + 1) * bpc);
    const uintptr_t base = region_.base + row.slot * region_.row_stride + worker;
    const int64_t* ids = spec_->gpu_block_ids.data() + gi.block_pos - gi.skip;
    const std::vector<uint32_t>& order = layout_->host_ref_order_[row.group];
    const std::vector<KvGroupRef>& refs = ls.groups[row.group].refs;
    for (; st->ref < order.size(); ++st->ref, st->i = 0) {
      const KvGroupRef& ref = refs[order[st->ref]];
      const KvTensorLayout& t = ls.tensors[ref.tensor_index];
      const uintptr_t area = base + layout_->tensor_area_offset_[ref.tensor_index] +
                             (pos_begin - c * bpc) * t.page_bytes;
      for (uint64_t i = st->i; pos_begin + i < pos_end; ++i) {
        const uintptr_t gpu = t.base + static_cast<uint64_t>(ids[pos_begin + i]) * t.block_stride;
        const uintptr_t cpu = area + i * t.page_bytes;
        const CopySegment seg =
            kD2h ? CopySegment{gpu, cpu, ref.copy_bytes} : CopySegment{cpu, gpu, ref.copy_bytes};
        if (!sink(seg)) {
          st->i = i + 1;
          return true;
        }
      }
    }
  }
  return false;
}

uint64_t HostRowExpander::Fill(std::vector<CopySegment>* out, uint64_t min_bytes) {
  if (done_) return 0;
  uint64_t added = 0;
  auto sink = [&](const CopySegment& s) {
    if (has_pending_ && pending_.src + pending_.bytes == s.src &&
        pending_.dst + pending_.bytes == s.dst) {
      pending_.bytes += s.bytes;
      return true;
    }
    if (has_pending_) {
      out->push_back(pending_);
      added += pending_.bytes;
    }
    pending_ = s;
    has_pending_ = true;
    return added < min_bytes;
  };
  const bool more = d2h_ ? Run<true>(&state_, sink) : Run<false>(&state_, sink);
  if (!more) {
    if (has_pending_) {
      out->push_back(pending_);
      added += pending_.bytes;
      has_pending_ = false;
    }
    done_ = true;
  }
  return added;
}

uint64_t HostRowExpander::CountSegments(uint64_t cap) const {
  if (layout_ == nullptr) return 0;
  State st;
  CopySegment last{};
  bool has = false;
  uint64_t count = 0;
  auto sink = [&](const CopySegment& s) {
    if (has && last.src + last.bytes == s.src && last.dst + last.bytes == s.dst) {
      last.bytes += s.bytes;
      return true;
    }
    last = s;
    has = true;
    return ++count <= cap;
  };
  if (d2h_) {
    Run<true>(&st, sink);
  } else {
    Run<false>(&st, sink);
  }
  return count;
}

Status ValidateSegments(std::span<const CopySegment> segments, uint64_t alignment) {
  if (alignment == 0) alignment = 1;
  // The message is built only for the segment that fails: a job can hold 10^5 segments, and
  // formatting a name for each cost more than the rest of a submit (issue 15's H200 run).
  auto bad = [](size_t i, const std::string& what) {
    return Status::InvalidArgument("segment " + std::to_string(i) + what);
  };
  // A power-of-two alignment (every layout's) is checked with a mask: a division per address
  // cost more than the rest of the check.
  const bool pow2 = (alignment & (alignment - 1)) == 0;
  const uint64_t mask = alignment - 1;
  for (size_t i = 0; i < segments.size(); ++i) {
    const CopySegment& s = segments[i];
    if (s.bytes == 0) return bad(i, " has zero bytes");
    if (s.src == 0 || s.dst == 0) return bad(i, " has a null address");
    uint64_t end = 0;
    if (AddOverflows(s.src, s.bytes, &end) || AddOverflows(s.dst, s.bytes, &end)) {
      return bad(i, " extends beyond the address space");
    }
    const bool misaligned =
        pow2 ? ((s.src | s.dst | s.bytes) & mask) != 0
             : (s.src % alignment != 0 || s.dst % alignment != 0 || s.bytes % alignment != 0);
    if (misaligned) return bad(i, " not aligned to " + std::to_string(alignment) + " bytes");
  }
  return Status::Ok();
}

void CoalesceSegments(std::vector<CopySegment>* segments, size_t first) {
  if (segments->size() <= first) return;
  size_t w = first;
  for (size_t r = first + 1; r < segments->size(); ++r) {
    CopySegment& last = (*segments)[w];
    const CopySegment& s = (*segments)[r];
    if (last.src + last.bytes == s.src && last.dst + last.bytes == s.dst) {
      last.bytes += s.bytes;
    } else {
      (*segments)[++w] = s;
    }
  }
  segments->resize(w + 1);
}

}  // namespace kvo
