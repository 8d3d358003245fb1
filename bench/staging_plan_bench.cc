// `kvo bench transfer`, cases staging_plan_*: the host-side cost of a CUDA staging submit, without
// a GPU (issue 15: one job in flight reached 54-80 % of the PCIe ceiling at 8-32 KiB segments on
// the H200 because the submit took ~150 ns per segment before the first copy started). Measured:
// everything the engine does before and between its CUDA calls for a block-spec job — expand,
// validate, the pinned-host check, order by host address, plan chunks (descriptors + host runs),
// the per-chunk DMA lists. Baseline in the same run: the algorithm the engine used before (kept
// here only): expansion in group/ref/block order, a per-segment pinned lookup, std::sort of every
// segment by host address, unreserved descriptor/run/chunk vectors, then a copy of the
// descriptors into the pinned block with the staging slot applied. Addresses are synthetic
// (nothing is copied), so the figures are the planning alone.
//
// Cases staging_plan_first_chunk_*: the time from the start of the submit until chunk 0 is
// planned (ready to enqueue: the GPU could start), for the engine's incremental planning
// (HostRowExpander: whole-job checks O(blocks), rows ordered by slot, segments generated per
// chunk) against, same run, the previous engine algorithm (whole-job ExpandBlockSpec,
// ValidateSegments and OrderByHost before chunk 0, then chunk by chunk; 384f90d). The
// staging_plan_* throughput cases measure the incremental planning of the whole job against the
// same previous algorithm; the older sort algorithm's figure is in their notes.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "transfer/transfer.h"

namespace kvo::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct DmaCopy {
  uintptr_t dst, src;
  uint64_t bytes;
};

constexpr uint64_t kChunk = 16ull << 20;  // CudaEngineTuning::staging_chunk_bytes
constexpr uint64_t kPiece = 64ull << 10;  // staging_idle.piece_bytes
constexpr uintptr_t kStage0 = 0x7f0000000000ull;
constexpr uintptr_t kStage1 = kStage0 + kChunk;

// A one-range stand-in for the engine's FindPinned (its pinned_ list holds the region).
struct PinnedRange {
  uintptr_t base;
  uint64_t bytes;
  bool Contains(uintptr_t a, uint64_t n) const {
    return a >= base && a - base <= bytes && n <= bytes - (a - base);
  }
};

// ---- The engine's submit planning before this change (baseline) --------------------------
// KvLayout::ExpandBlockSpec as it was (group, ref, block order; a division per segment), through
// the layout's public accessors; the checks before the loop are the same and are left out.
void OldExpand(const KvLayout& layout, const BlockTransferSpec& spec, const HostRegion& region,
               TransferDirection direction, std::vector<CopySegment>* out) {
  const KvLayoutSpec& ls = layout.spec();
  size_t refs = 0;
  for (size_t g = 0; g < ls.groups.size(); ++g)
    refs += ls.groups[g].refs.size() * spec.group_sizes[g];
  out->reserve(refs);
  const uint64_t bpc = ls.blocks_per_chunk;
  size_t block_pos = 0, slot_pos = 0;
  for (size_t g = 0; g < ls.groups.size(); ++g) {
    const uint64_t n = spec.group_sizes[g];
    const uint64_t skip = spec.block_indices.empty() ? 0 : spec.block_indices[g] % bpc;
    for (const KvGroupRef& ref : ls.groups[g].refs) {
      const KvTensorLayout& t = ls.tensors[ref.tensor_index];
      const uint64_t area = layout.TensorAreaOffset(ref.tensor_index);
      for (uint64_t i = 0; i < n; ++i) {
        const int64_t block = spec.gpu_block_ids[block_pos + i];
        if (block < 0 || static_cast<uint64_t>(block) >= t.num_blocks) std::abort();
        const uint64_t pos = skip + i;
        const uint64_t slot = static_cast<uint64_t>(spec.cpu_slots[slot_pos + pos / bpc]);
        const uintptr_t gpu = t.base + static_cast<uint64_t>(block) * t.block_stride;
        const uintptr_t cpu =
            region.base + slot * region.row_stride + area + (pos % bpc) * t.page_bytes;
        if (direction == TransferDirection::kGpuToCpu) {
          out->push_back({gpu, cpu, ref.copy_bytes});
        } else {
          out->push_back({cpu, gpu, ref.copy_bytes});
        }
      }
    }
    block_pos += n;
    slot_pos += layout.SlotsForGroup(n, spec.block_indices.empty() ? 0 : spec.block_indices[g]);
  }
  CoalesceSegments(out, 0);
}

// ValidateSegments as it was (three divisions per segment).
bool OldValidate(const std::vector<CopySegment>& segments, uint64_t alignment) {
  for (const CopySegment& s : segments) {
    uint64_t end = 0;
    if (s.bytes == 0 || s.src == 0 || s.dst == 0 || __builtin_add_overflow(s.src, s.bytes, &end) ||
        __builtin_add_overflow(s.dst, s.bytes, &end) || s.src % alignment != 0 ||
        s.dst % alignment != 0 || s.bytes % alignment != 0) {
      return false;
    }
  }
  return true;
}

uint64_t OldPlan(const KvLayout& layout, const HostRegion& region, const BlockTransferSpec& spec,
                 TransferDirection dir, const PinnedRange& pinned,
                 std::vector<PieceDesc>* pinned_descs, uint64_t* next_slot) {
  std::vector<CopySegment> segs;
  OldExpand(layout, spec, region, dir, &segs);
  // The alignment as a runtime value, as the engine passed it.
  static volatile uint64_t alignment = 1;
  if (!OldValidate(segs, alignment)) std::abort();
  const bool d2h = dir == TransferDirection::kGpuToCpu;
  uint64_t total = 0;
  bool host_pinned = true;
  for (const CopySegment& s : segs) {
    total += s.bytes;
    if (host_pinned && !pinned.Contains(d2h ? s.dst : s.src, s.bytes)) host_pinned = false;
  }
  if (!host_pinned) std::abort();
  auto host_of = [d2h](const CopySegment& s) { return d2h ? s.dst : s.src; };
  std::sort(segs.begin(), segs.end(),
            [&](const CopySegment& a, const CopySegment& b) { return host_of(a) < host_of(b); });
  struct ChunkPlan {
    size_t desc_begin = 0, desc_end = 0;
    size_t run_begin = 0, run_end = 0;
  };
  struct Run {
    uintptr_t host;
    uint64_t offset;
    uint64_t bytes;
  };
  std::vector<ChunkPlan> chunks;
  std::vector<Run> runs;
  std::vector<PieceDesc> descs;
  uint64_t remaining = total;
  const uint64_t small = kChunk / 8;
  auto next_limit = [&](bool first) {
    if (first && remaining > small) return small;
    if (remaining <= small) return remaining;
    if (remaining <= kChunk + small) return remaining - small;
    return kChunk;
  };
  uint64_t limit = 0, fill = 0;
  for (const CopySegment& s : segs) {
    uintptr_t gpu = d2h ? s.src : s.dst;
    uintptr_t host = host_of(s);
    uint64_t done = 0;
    while (done < s.bytes) {
      if (fill == limit) {
        limit = next_limit(chunks.empty());
        if (!chunks.empty()) {
          chunks.back().desc_end = descs.size();
          chunks.back().run_end = runs.size();
        }
        chunks.push_back({descs.size(), 0, runs.size(), 0});
        fill = 0;
      }
      uint64_t n = std::min({s.bytes - done, limit - fill, kPiece});
      if (d2h) {
        descs.push_back({gpu + done, fill, n, 0});
      } else {
        descs.push_back({fill, gpu + done, n, 0});
      }
      if (runs.size() > chunks.back().run_begin &&
          runs.back().host + runs.back().bytes == host + done &&
          runs.back().offset + runs.back().bytes == fill) {
        runs.back().bytes += n;
      } else {
        runs.push_back({host + done, fill, n});
      }
      fill += n;
      done += n;
      remaining -= n;
    }
  }
  chunks.back().desc_end = descs.size();
  chunks.back().run_end = runs.size();
  if (pinned_descs->size() < descs.size()) std::abort();
  std::vector<int> slots(chunks.size());
  uint64_t runs_total = 0;
  for (size_t ci = 0; ci < chunks.size(); ++ci) {
    const ChunkPlan& c = chunks[ci];
    slots[ci] = static_cast<int>((*next_slot)++ % 2);
    const uintptr_t stage = slots[ci] == 0 ? kStage0 : kStage1;
    for (size_t i = c.desc_begin; i < c.desc_end; ++i) {
      PieceDesc d = descs[i];
      if (d2h) {
        d.dst += stage;
      } else {
        d.src += stage;
      }
      (*pinned_descs)[i] = d;
    }
  }
  for (size_t ci = 0; ci < chunks.size(); ++ci) {
    const ChunkPlan& c = chunks[ci];
    const uintptr_t stage = slots[ci] == 0 ? kStage0 : kStage1;
    std::vector<DmaCopy> copies;
    copies.reserve(c.run_end - c.run_begin);
    for (size_t i = c.run_begin; i < c.run_end; ++i) {
      const Run& r = runs[i];
      if (d2h) {
        copies.push_back({r.host, stage + r.offset, r.bytes});
      } else {
        copies.push_back({stage + r.offset, r.host, r.bytes});
      }
    }
    runs_total += copies.size();
  }
  return runs_total;
}

// The staging parameters the engine plans with (two staging buffers of kChunk).
StagingPlanner::Params EngineParams(bool d2h, uint64_t first_slot) {
  StagingPlanner::Params p;
  p.chunk_bytes = kChunk;
  p.piece_bytes = kPiece;
  p.staging = {kStage0, kStage1};
  p.first_slot = first_slot;
  p.d2h = d2h;
  return p;
}

// Drains `planner` as the engine's submit does: one DMA list per chunk (host <-> the chunk's
// staging buffer), the time from `start` to the first chunk into *first_chunk_ns. Returns the
// number of DMA copies.
uint64_t DrainChunks(StagingPlanner& planner, const StagingPlanner::Params& p,
                     std::vector<DmaCopy>* copies, uint64_t* next_slot, Clock::time_point start,
                     double* first_chunk_ns) {
  StagingChunk c;
  uint64_t runs_total = 0;
  while (planner.Next(&c)) {
    if (first_chunk_ns != nullptr && *next_slot == p.first_slot) {
      *first_chunk_ns = std::chrono::duration<double, std::nano>(Clock::now() - start).count();
    }
    ++*next_slot;
    const uintptr_t stage = p.staging[c.slot];
    copies->clear();
    for (const StagingRun& r : planner.runs()) {
      if (p.d2h) {
        copies->push_back({r.host, stage + r.offset, r.bytes});
      } else {
        copies->push_back({stage + r.offset, r.host, r.bytes});
      }
    }
    runs_total += copies->size();
  }
  if (planner.overflowed()) std::abort();
  return runs_total;
}

// ---- The engine's submit planning before the incremental expansion (384f90d) ----------------

struct WholeJobPlanner {
  std::vector<CopySegment> segs;
  HostOrderScratch scratch;
  StagingPlanner planner;
  std::vector<DmaCopy> copies;

  // `first_chunk_ns`: time from the call until chunk 0 is planned.
  uint64_t Plan(const KvLayout& layout, const HostRegion& region, const BlockTransferSpec& spec,
                TransferDirection dir, const PinnedRange& pinned,
                std::vector<PieceDesc>* pinned_descs, uint64_t* next_slot,
                double* first_chunk_ns = nullptr) {
    const auto start = Clock::now();
    segs.clear();
    if (!layout.ExpandBlockSpec(spec, region, dir, true, &segs, ExpandOrder::kHostRow).ok()) {
      std::abort();
    }
    if (!ValidateSegments(segs, 1).ok()) std::abort();
    const bool d2h = dir == TransferDirection::kGpuToCpu;
    uint64_t total = 0;
    for (const CopySegment& s : segs) total += s.bytes;
    if (!pinned.Contains(region.base, region.bytes())) std::abort();
    if (!OrderByHost(&segs, d2h, &scratch).ok()) std::abort();
    const StagingPlanner::Params p = EngineParams(d2h, *next_slot);
    const size_t max = StagingPlanner::MaxDescs(segs, total, p);
    if (pinned_descs->size() < max) std::abort();
    planner.Begin(segs, total, p, pinned_descs->data(), pinned_descs->size());
    return DrainChunks(planner, p, &copies, next_slot, start, first_chunk_ns);
  }
};

// ---- The engine's submit planning now (transfer/cuda/cuda_engine.cc, minus the CUDA calls) ---
struct IncrementalPlanner {
  HostRowExpander expander;
  StagingPlanner planner;
  std::vector<DmaCopy> copies;

  uint64_t Plan(const KvLayout& layout, const HostRegion& region, const BlockTransferSpec& spec,
                TransferDirection dir, const PinnedRange& pinned,
                std::vector<PieceDesc>* pinned_descs, uint64_t* next_slot,
                double* first_chunk_ns = nullptr) {
    const auto start = Clock::now();
    if (!expander.Begin(layout, spec, region, dir).ok()) std::abort();
    const uint64_t total = expander.total_bytes();
    if (!pinned.Contains(region.base, region.bytes())) std::abort();
    // auto's question (an average merged segment >= 1 MiB?), as the engine asks it.
    static volatile uint64_t large = 1ull << 20;
    if (expander.CountSegments(total / large) == 0) std::abort();
    const bool d2h = dir == TransferDirection::kGpuToCpu;
    const StagingPlanner::Params p = EngineParams(d2h, *next_slot);
    const size_t max = StagingPlanner::MaxDescs(expander.MaxPieces(kPiece), total, p);
    if (pinned_descs->size() < max) std::abort();
    planner.Begin(&expander, total, p, pinned_descs->data(), pinned_descs->size());
    return DrainChunks(planner, p, &copies, next_slot, start, first_chunk_ns);
  }
};

// Median and minimum time to the first chunk over repeated plans, alternating the two planners
// call by call (so load on the machine hits both alike), for about `seconds` in all.
template <typename A, typename B>
void FirstChunkTimes(A&& a, B&& b, double seconds, double* a_med, double* a_min, double* b_med,
                     double* b_min) {
  std::vector<double> ta, tb;
  const auto start = Clock::now();
  do {
    double x = 0, y = 0;
    a(&x);
    b(&y);
    ta.push_back(x);
    tb.push_back(y);
  } while (ta.size() < 5 ||
           (std::chrono::duration<double>(Clock::now() - start).count() < seconds &&
            ta.size() < 100000));
  *a_med = Percentile(ta, 50);
  *b_med = Percentile(tb, 50);
  *a_min = *std::min_element(ta.begin(), ta.end());
  *b_min = *std::min_element(tb.begin(), tb.end());
}

struct Geometry {
  std::string name;
  uint64_t page;     // bytes per (block, tensor) segment
  uint32_t tensors;  // tensors, every group refers to all of them (vLLM's hybrid sharing)
  uint32_t groups;
  uint64_t job_blocks;  // blocks per job over all groups
  bool shuffled_slots;  // CPU slots in random order (else ascending, as the worker bench)
};

}  // namespace

int RunStagingPlanCases(const BenchOptions& options) {
  const uint32_t seed = 1515;
  std::vector<Geometry> cases;
  for (uint64_t kib : {8, 16, 32}) {
    const uint64_t page = kib << 10;
    // The H200 worker bench's job: 512 MiB, 16 tensors shared by 2 groups (32 layers).
    const uint64_t big = (512ull << 20) / (16 * page);
    cases.push_back({"512MiB_" + std::to_string(kib) + "KiB", page, 16, 2, big, false});
    // A vLLM step's store: 16 blocks of 32 layers x (K, V) = 1024 segments.
    cases.push_back({"16blocks_64tensors_" + std::to_string(kib) + "KiB", page, 64, 1, 16, false});
  }
  // The sort's worst case for the new path: slots in random order.
  cases.push_back({"512MiB_8KiB_shuffled_slots", 8 << 10, 16, 2, 4096, true});
  const double secs = options.quick ? 0.06 : options.seconds_per_case;
  std::mt19937_64 rng(seed);
  for (const Geometry& g : cases) {
    const uint64_t gpu_blocks = 2 * g.job_blocks + 64;
    KvLayoutSpec spec;
    KvGroupLayout group;
    for (uint32_t t = 0; t < g.tensors; ++t) {
      spec.tensors.push_back(
          {0x100000000000ull + t * (gpu_blocks * g.page + 4096), gpu_blocks, g.page, g.page});
      group.refs.push_back({t, g.page});
    }
    spec.groups.assign(g.groups, group);
    auto layout = KvLayout::Create(spec);
    if (!layout.ok()) return 1;
    auto region = layout->MakeHostRegion(0x200000000000ull, g.job_blocks * layout->row_stride());
    if (!region.ok()) return 1;
    BlockTransferSpec bs;
    std::vector<int64_t> ids(gpu_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    bs.gpu_block_ids.assign(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(g.job_blocks));
    bs.group_sizes.assign(g.groups, static_cast<uint32_t>(g.job_blocks / g.groups));
    for (uint64_t i = 0; i < g.job_blocks; ++i) bs.cpu_slots.push_back(static_cast<int64_t>(i));
    if (g.shuffled_slots) std::shuffle(bs.cpu_slots.begin(), bs.cpu_slots.end(), rng);
    const PinnedRange pinned{region->base, region->bytes()};
    const double segments = static_cast<double>(g.job_blocks * g.tensors);
    for (auto dir : {TransferDirection::kGpuToCpu, TransferDirection::kCpuToGpu}) {
      std::vector<PieceDesc> old_descs(static_cast<size_t>(segments) + 64);
      std::vector<PieceDesc> prev_descs(static_cast<size_t>(segments) + 64);
      std::vector<PieceDesc> new_descs(static_cast<size_t>(segments) + 64);
      uint64_t old_slot = 0, prev_slot = 0, new_slot = 0, old_runs = 0, prev_runs = 0, new_runs = 0;
      WholeJobPlanner pp;
      IncrementalPlanner np;
      const double old_rate = MeasureRate(
          [&] { old_runs = OldPlan(*layout, *region, bs, dir, pinned, &old_descs, &old_slot); },
          segments, secs);
      const double prev_rate = MeasureRate(
          [&] { prev_runs = pp.Plan(*layout, *region, bs, dir, pinned, &prev_descs, &prev_slot); },
          segments, secs);
      const double new_rate = MeasureRate(
          [&] { new_runs = np.Plan(*layout, *region, bs, dir, pinned, &new_descs, &new_slot); },
          segments, secs);
      const std::string dname(TransferDirectionName(dir));
      BenchResult r;
      r.area = "transfer";
      r.name = "staging_plan_" + g.name + "_" + dname;
      r.unit = "segments/s";
      r.value = new_rate;
      r.baseline_name = "the previous submit planning (whole-job expansion before chunk 0)";
      r.baseline = prev_rate;
      char notes[320];
      std::snprintf(notes, sizeof(notes),
                    "%.0f segments/job; ns/segment %.1f (whole-job %.1f, sort of all segments "
                    "%.1f); DMA runs/job %llu (whole-job %llu, sort %llu); seed %u",
                    segments, 1e9 / new_rate, 1e9 / prev_rate, 1e9 / old_rate,
                    static_cast<unsigned long long>(new_runs),
                    static_cast<unsigned long long>(prev_runs),
                    static_cast<unsigned long long>(old_runs), seed);
      r.notes = notes;
      PrintResult(r, options);

      double new_med = 0, new_min = 0, prev_med = 0, prev_min = 0;
      FirstChunkTimes(
          [&](double* ns) {
            np.Plan(*layout, *region, bs, dir, pinned, &new_descs, &new_slot, ns);
          },
          [&](double* ns) {
            pp.Plan(*layout, *region, bs, dir, pinned, &prev_descs, &prev_slot, ns);
          },
          secs, &new_med, &new_min, &prev_med, &prev_min);
      BenchResult f;
      f.area = "transfer";
      f.name = "staging_plan_first_chunk_" + g.name + "_" + dname;
      f.unit = "first_chunks/s";  // 1 / (median time from the submit's start to chunk 0 planned)
      f.value = 1e9 / new_med;
      f.baseline_name = "the previous submit planning (whole-job expansion before chunk 0)";
      f.baseline = 1e9 / prev_med;
      std::snprintf(notes, sizeof(notes),
                    "time to first chunk: median %.1f us (was %.1f), min %.1f us (was %.1f); the "
                    "sort algorithm planned the whole job first: %.1f us; seed %u",
                    new_med / 1e3, prev_med / 1e3, new_min / 1e3, prev_min / 1e3,
                    segments / old_rate * 1e6, seed);
      f.notes = notes;
      PrintResult(f, options);
    }
  }
  return 0;
}

}  // namespace kvo::bench
