#include "transfer/staging_plan.h"

#include <algorithm>
#include <limits>
#include <string>

namespace kvo {
namespace {

// The size of the next chunk with `remaining` bytes left (see staging_plan.h: the first and the
// last chunk are chunk / 8).
uint64_t NextLimit(uint64_t remaining, uint64_t chunk, bool first) {
  const uint64_t small = chunk / 8;
  if (first && remaining > small) return small;
  if (remaining <= small) return remaining;
  if (remaining <= chunk + small) return remaining - small;
  return chunk;
}

// One pass: the number of host-contiguous spans and whether they ascend (each starts at or after
// the end of the one before).
template <bool kD2h>
size_t CountSpans(const std::vector<CopySegment>& segs, bool* ordered) {
  auto host = [](const CopySegment& s) { return kD2h ? s.dst : s.src; };
  size_t spans = 1;
  bool asc = true;
  uintptr_t end = host(segs[0]) + segs[0].bytes;
  for (size_t i = 1; i < segs.size(); ++i) {
    const uintptr_t h = host(segs[i]);
    if (h != end) {
      ++spans;
      asc &= h > end;
    }
    end = h + segs[i].bytes;
  }
  *ordered = asc;
  return spans;
}

template <bool kD2h>
void SortSpans(std::vector<CopySegment>* segments, HostOrderScratch* scratch) {
  auto host = [](const CopySegment& s) { return kD2h ? s.dst : s.src; };
  std::vector<CopySegment>& segs = *segments;
  auto& spans = scratch->spans;
  spans.clear();
  uintptr_t end = 0;
  for (size_t i = 0; i < segs.size(); ++i) {
    const uintptr_t h = host(segs[i]);
    if (i == 0 || h != end) {
      spans.push_back({h, static_cast<uint32_t>(i), 1});
    } else {
      ++spans.back().count;
    }
    end = h + segs[i].bytes;
  }
  std::sort(spans.begin(), spans.end(), [](const auto& a, const auto& b) {
    return a.host != b.host ? a.host < b.host : a.first < b.first;
  });
  auto& out = scratch->segments;
  out.resize(segs.size());
  size_t w = 0;
  for (const auto& sp : spans) {
    std::copy_n(segs.begin() + sp.first, sp.count, out.begin() + static_cast<std::ptrdiff_t>(w));
    w += sp.count;
  }
  segs.swap(out);
}

}  // namespace

Result<size_t> OrderByHost(std::vector<CopySegment>* segments, bool d2h,
                           HostOrderScratch* scratch) {
  if (segments->empty()) return size_t{0};
  if (segments->size() > std::numeric_limits<uint32_t>::max()) {
    return Status::InvalidArgument("transfer job: " + std::to_string(segments->size()) +
                                   " segments (at most 2^32 - 1)");
  }
  bool ordered = false;
  const size_t spans =
      d2h ? CountSpans<true>(*segments, &ordered) : CountSpans<false>(*segments, &ordered);
  if (ordered) return spans;
  if (d2h) {
    SortSpans<true>(segments, scratch);
  } else {
    SortSpans<false>(segments, scratch);
  }
  return spans;
}

size_t StagingPlanner::ChunkCount(uint64_t total_bytes, uint64_t chunk_bytes) {
  size_t chunks = 0;
  while (total_bytes > 0) {
    total_bytes -= NextLimit(total_bytes, chunk_bytes, chunks == 0);
    ++chunks;
  }
  return chunks;
}

size_t StagingPlanner::MaxDescs(std::span<const CopySegment> segments, uint64_t total_bytes,
                                const Params& params) {
  size_t pieces = 0;
  const uint64_t piece = params.piece_bytes;
  for (const CopySegment& s : segments) {
    pieces += s.bytes <= piece ? 1 : (s.bytes + piece - 1) / piece;
  }
  return pieces + ChunkCount(total_bytes, params.chunk_bytes);
}

size_t StagingPlanner::MaxDescs(uint64_t max_pieces, uint64_t total_bytes, const Params& params) {
  return static_cast<size_t>(max_pieces) + ChunkCount(total_bytes, params.chunk_bytes);
}

void StagingPlanner::Begin(HostRowExpander* source, uint64_t total_bytes, const Params& params,
                           PieceDesc* descs, size_t capacity) {
  Begin(std::span<const CopySegment>(), total_bytes, params, descs, capacity);
  source_ = source;
  window_.clear();
}

void StagingPlanner::Begin(std::span<const CopySegment> segments, uint64_t total_bytes,
                           const Params& params, PieceDesc* descs, size_t capacity) {
  segs_ = segments;
  source_ = nullptr;
  p_ = params;
  descs_ = descs;
  capacity_ = capacity;
  used_ = 0;
  seg_ = 0;
  done_ = 0;
  remaining_ = total_bytes;
  chunk_index_ = 0;
  overflowed_ = false;
  runs_.clear();
}

bool StagingPlanner::Next(StagingChunk* chunk) {
  runs_.clear();
  if (remaining_ == 0 || overflowed_) return false;
  const uint64_t limit = NextLimit(remaining_, p_.chunk_bytes, chunk_index_ == 0);
  chunk->slot = static_cast<uint32_t>((p_.first_slot + chunk_index_) % 2);
  ++chunk_index_;
  chunk->desc_begin = used_;
  const uintptr_t stage = p_.staging[chunk->slot];
  const bool d2h = p_.d2h;
  uint64_t fill = 0;
  while (fill < limit) {
    if (seg_ >= segs_.size() && source_ != nullptr && !source_->done()) {
      // The window is used up (no segment half planned): the next segments, at least what this
      // chunk still needs.
      window_.clear();
      source_->Fill(&window_, limit - fill);
      segs_ = window_;
      seg_ = 0;
    }
    // Fewer segment bytes than total_bytes, or a buffer below MaxDescs: the caller's bug.
    if (seg_ >= segs_.size() || used_ == capacity_) {
      overflowed_ = true;
      return false;
    }
    const CopySegment& s = segs_[seg_];
    const uintptr_t gpu = (d2h ? s.src : s.dst) + done_;
    const uintptr_t host = (d2h ? s.dst : s.src) + done_;
    const uint64_t n = std::min({s.bytes - done_, limit - fill, p_.piece_bytes});
    descs_[used_++] = d2h ? PieceDesc{gpu, stage + fill, n, 0} : PieceDesc{stage + fill, gpu, n, 0};
    // Staging offsets are consecutive within a chunk, so only the host side decides a run.
    if (!runs_.empty() && runs_.back().host + runs_.back().bytes == host) {
      runs_.back().bytes += n;
    } else {
      runs_.push_back({host, fill, n});
    }
    fill += n;
    done_ += n;
    if (done_ == s.bytes) {
      ++seg_;
      done_ = 0;
    }
  }
  remaining_ -= limit;
  chunk->desc_end = used_;
  return true;
}

}  // namespace kvo
