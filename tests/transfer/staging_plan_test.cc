// The CUDA staging method's host-side planning (transfer/staging_plan.h) and the host-row
// expansion order it relies on, on CPU memory: plans are executed with memcpy (gather into the
// staging slot, then the host runs; or the reverse) and every byte is compared.
#include "transfer/staging_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "transfer/kv_layout.h"

namespace kvo {
namespace {

uintptr_t HostOf(const CopySegment& s, bool d2h) { return d2h ? s.dst : s.src; }

std::vector<CopySegment> Sorted(std::vector<CopySegment> v) {
  std::sort(v.begin(), v.end(), [](const CopySegment& a, const CopySegment& b) {
    return a.src != b.src ? a.src < b.src : a.dst < b.dst;
  });
  return v;
}

// Two tensors, two groups, 2 blocks per chunk, worker 1 of 2 (as kv_layout_test's).
KvLayoutSpec TwoTensorSpec() {
  KvLayoutSpec s;
  s.tensors = {{0x10000, 8, 256, 192}, {0x20000, 8, 256, 192}};
  s.groups = {{{{1, 128}, {0, 128}}}, {{{1, 192}}}};  // group 0 names tensor 1 first
  s.blocks_per_chunk = 2;
  s.num_workers = 2;
  s.worker_index = 1;
  return s;
}

TEST(ExpandOrderTest, HostRowEmitsEachRowInHostOrder) {
  auto layout = KvLayout::Create(TwoTensorSpec());
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  HostRegion region{0x100000, 4, 4096};
  BlockTransferSpec spec{{5, 6, 7, 2}, {3, 1}, {3, 0}, {2, 0, 3}};
  std::vector<CopySegment> rows, refs;
  ASSERT_TRUE(layout
                  ->ExpandBlockSpec(spec, region, TransferDirection::kGpuToCpu, false, &rows,
                                    ExpandOrder::kHostRow)
                  .ok());
  ASSERT_TRUE(
      layout->ExpandBlockSpec(spec, region, TransferDirection::kGpuToCpu, false, &refs).ok());
  const uintptr_t row2 = 0x100000 + 2 * 4096, row0 = 0x100000, row3 = 0x100000 + 3 * 4096;
  // Group 0: chunk 0 (slot 2) holds position 1; chunk 1 (slot 0) positions 2, 3. Tensor 0's
  // area (768) before tensor 1's (1152) although the group names tensor 1 first.
  std::vector<CopySegment> want = {
      {0x10000 + 5 * 256, row2 + 768 + 192, 128}, {0x20000 + 5 * 256, row2 + 1152 + 192, 128},
      {0x10000 + 6 * 256, row0 + 768, 128},       {0x10000 + 7 * 256, row0 + 768 + 192, 128},
      {0x20000 + 6 * 256, row0 + 1152, 128},      {0x20000 + 7 * 256, row0 + 1152 + 192, 128},
      {0x20000 + 2 * 256, row3 + 1152, 192},
  };
  EXPECT_EQ(rows, want);
  EXPECT_EQ(Sorted(rows), Sorted(refs));  // the same segments in another order

  // A block outside its tensor: the same error, nothing appended.
  std::vector<CopySegment> out = {{1, 2, 3}};
  BlockTransferSpec bad{{5, 6, 8, 2}, {3, 1}, {3, 0}, {2, 0, 3}};
  Status st = layout->ExpandBlockSpec(bad, region, TransferDirection::kCpuToGpu, true, &out,
                                      ExpandOrder::kHostRow);
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange) << st.ToString();
  EXPECT_NE(st.message().find("GPU block 8"), std::string::npos) << st.ToString();
  EXPECT_EQ(out.size(), 1u);
}

// Random layouts and specs: both orders give the same segments; with ascending slots the host-row
// order is already host-ordered (OrderByHost moves nothing).
TEST(ExpandOrderTest, RandomSpecsSameSegmentsAndAscendingRows) {
  const uint32_t seed = 20261202;
  std::mt19937 rng(seed);
  for (int iter = 0; iter < 200; ++iter) {
    SCOPED_TRACE("seed " + std::to_string(seed) + " iter " + std::to_string(iter));
    KvLayoutSpec s;
    const uint32_t tensors = 1 + rng() % 6, groups = 1 + rng() % 3;
    const uint64_t page = 16 * (1 + rng() % 16);
    for (uint32_t t = 0; t < tensors; ++t) {
      s.tensors.push_back({0x1000000 + t * 0x100000, 64, page + 16 * (rng() % 3), page});
    }
    for (uint32_t g = 0; g < groups; ++g) {
      KvGroupLayout gl;
      std::vector<uint32_t> ts(tensors);
      std::iota(ts.begin(), ts.end(), 0);
      std::shuffle(ts.begin(), ts.end(), rng);
      for (uint32_t i = 0; i < 1 + rng() % tensors; ++i) gl.refs.push_back({ts[i], page});
      s.groups.push_back(gl);
    }
    s.blocks_per_chunk = 1 + rng() % 4;
    auto layout = KvLayout::Create(s);
    ASSERT_TRUE(layout.ok()) << layout.status().ToString();
    HostRegion region{0x40000000, 256, layout->row_stride()};
    BlockTransferSpec spec;
    uint64_t slots = 0;
    for (uint32_t g = 0; g < groups; ++g) {
      const uint32_t n = rng() % 12;
      const uint64_t index = rng() % 8;
      spec.group_sizes.push_back(n);
      spec.block_indices.push_back(index);
      for (uint32_t i = 0; i < n; ++i) spec.gpu_block_ids.push_back(rng() % 64);
      slots += layout->SlotsForGroup(n, index);
    }
    for (uint64_t i = 0; i < slots; ++i) spec.cpu_slots.push_back(static_cast<int64_t>(i));
    const bool coalesce = rng() % 2 == 0;
    for (auto dir : {TransferDirection::kGpuToCpu, TransferDirection::kCpuToGpu}) {
      std::vector<CopySegment> rows, refs;
      ASSERT_TRUE(
          layout->ExpandBlockSpec(spec, region, dir, false, &rows, ExpandOrder::kHostRow).ok());
      ASSERT_TRUE(layout->ExpandBlockSpec(spec, region, dir, false, &refs).ok());
      EXPECT_EQ(Sorted(rows), Sorted(refs));
      if (coalesce) CoalesceSegments(&rows);
      const std::vector<CopySegment> before = rows;
      HostOrderScratch scratch;
      const bool d2h = dir == TransferDirection::kGpuToCpu;
      ASSERT_TRUE(OrderByHost(&rows, d2h, &scratch).ok());
      EXPECT_EQ(rows, before);  // ascending slots: already in host order, left as they are
      for (size_t i = 1; i < rows.size(); ++i) {
        EXPECT_GE(HostOf(rows[i], d2h), HostOf(rows[i - 1], d2h) + rows[i - 1].bytes);
      }
    }
  }
}

TEST(OrderByHostTest, SortsSpansAndKeepsContiguousRunsTogether) {
  const uint32_t seed = 77;
  std::mt19937 rng(seed);
  for (int iter = 0; iter < 100; ++iter) {
    SCOPED_TRACE("seed 77 iter " + std::to_string(iter));
    // Host ranges laid out back to back in random order with random gaps.
    const size_t n = 1 + rng() % 300;
    std::vector<CopySegment> segs(n);
    uintptr_t host = 0x10000000;
    for (size_t i = 0; i < n; ++i) {
      segs[i].bytes = 16 * (1 + rng() % 64);
      if (rng() % 3 == 0) host += 16 * (rng() % 4);
      segs[i].dst = host;
      segs[i].src = 0x90000000 + i * 0x10000;
      host += segs[i].bytes;
    }
    // Shuffle blocks of consecutive segments (spans move as units or are split).
    std::vector<CopySegment> in;
    std::vector<size_t> cut = {0, n};
    for (int c = 0; c < 8; ++c) cut.push_back(rng() % n);
    std::sort(cut.begin(), cut.end());
    cut.erase(std::unique(cut.begin(), cut.end()), cut.end());
    std::vector<std::pair<size_t, size_t>> pieces;
    for (size_t i = 0; i + 1 < cut.size(); ++i) pieces.push_back({cut[i], cut[i + 1]});
    std::shuffle(pieces.begin(), pieces.end(), rng);
    for (auto [a, b] : pieces) in.insert(in.end(), segs.begin() + a, segs.begin() + b);
    for (bool d2h : {true, false}) {
      std::vector<CopySegment> v = in;
      if (!d2h) {
        for (auto& s : v) std::swap(s.src, s.dst);
      }
      HostOrderScratch scratch;
      auto spans = OrderByHost(&v, d2h, &scratch);
      ASSERT_TRUE(spans.ok());
      EXPECT_GE(*spans, 1u);
      ASSERT_EQ(v.size(), n);
      for (size_t i = 0; i < n; ++i) {
        EXPECT_EQ(HostOf(v[i], d2h), segs[i].dst) << i;  // exactly host order
        EXPECT_EQ(v[i].bytes, segs[i].bytes);
      }
    }
  }
}

// Executes a plan on CPU memory and compares every byte: random segments, chunk and piece sizes.
TEST(StagingPlannerTest, PlansExecuteByteExactAndStayInBounds) {
  const uint32_t seed = 4242;
  std::mt19937 rng(seed);
  StagingPlanner planner;  // reused across jobs, as the engine does
  uint64_t next_slot = 0;
  for (int iter = 0; iter < 60; ++iter) {
    SCOPED_TRACE("seed 4242 iter " + std::to_string(iter));
    const bool d2h = rng() % 2 == 0;
    const size_t n = 1 + rng() % 400;
    std::vector<uint64_t> sizes(n);
    uint64_t total = 0;
    for (auto& b : sizes) {
      b = rng() % 4 == 0 ? 1 + rng() % 9000 : 16 * (1 + rng() % 512);  // some unaligned
      total += b;
    }
    std::vector<uint8_t> gpu(total), host(total + 16 * n, 0), want(host.size(), 0);
    const uint32_t salt = rng();
    for (size_t i = 0; i < gpu.size(); ++i) gpu[i] = static_cast<uint8_t>((i * 131 + salt) >> 3);
    // Segment i: gpu bytes at a shuffled position, host at ascending positions with gaps.
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<uint64_t> gpu_off(n);
    uint64_t off = 0;
    for (size_t i : order) {
      gpu_off[i] = off;
      off += sizes[i];
    }
    std::vector<CopySegment> segs;
    uint64_t hoff = 0;
    for (size_t i = 0; i < n; ++i) {
      if (rng() % 4 == 0) hoff += 16;
      const uintptr_t g = reinterpret_cast<uintptr_t>(gpu.data() + gpu_off[i]);
      const uintptr_t h = reinterpret_cast<uintptr_t>(host.data() + hoff);
      std::memcpy(want.data() + hoff, gpu.data() + gpu_off[i], sizes[i]);
      segs.push_back(d2h ? CopySegment{g, h, sizes[i]} : CopySegment{h, g, sizes[i]});
      hoff += sizes[i];
    }
    std::shuffle(segs.begin(), segs.end(), rng);
    HostOrderScratch scratch;
    ASSERT_TRUE(OrderByHost(&segs, d2h, &scratch).ok());

    StagingPlanner::Params p;
    p.chunk_bytes = (1 + rng() % 4) << 15;  // 32-128 KiB: many chunks per job
    p.piece_bytes = 16 * (1 + rng() % 512);
    std::vector<uint8_t> stage0(p.chunk_bytes), stage1(p.chunk_bytes);
    p.staging = {reinterpret_cast<uintptr_t>(stage0.data()),
                 reinterpret_cast<uintptr_t>(stage1.data())};
    p.first_slot = next_slot;
    p.d2h = d2h;
    const size_t max = StagingPlanner::MaxDescs(segs, total, p);
    std::vector<PieceDesc> descs(max + 1, PieceDesc{0, 0, 0, 0xdead});
    planner.Begin(segs, total, p, descs.data(), max);
    // H2D: the "GPU" side starts zeroed and must end up equal to the original bytes.
    std::vector<uint8_t> gpu_before = gpu;
    if (!d2h) {
      std::memcpy(host.data(), want.data(), host.size());
      std::fill(gpu.begin(), gpu.end(), 0);
    }
    StagingChunk c;
    size_t chunks = 0;
    uint64_t planned = 0;
    while (planner.Next(&c)) {
      EXPECT_EQ(c.slot, (next_slot + chunks) % 2);
      ++chunks;
      const uintptr_t stage = p.staging[c.slot];
      uint64_t fill = 0;
      for (size_t i = c.desc_begin; i < c.desc_end; ++i) {
        const PieceDesc& d = descs[i];
        ASSERT_LE(d.bytes, p.piece_bytes);
        ASSERT_GT(d.bytes, 0u);
        EXPECT_EQ((d2h ? d.dst : d.src) - stage, fill);  // staging filled back to back
        fill += d.bytes;
      }
      ASSERT_LE(fill, p.chunk_bytes);
      if (chunks == 1 && total > p.chunk_bytes / 8) {
        EXPECT_EQ(fill, p.chunk_bytes / 8);  // the short first chunk
      }
      uint64_t run_bytes = 0;
      for (const StagingRun& r : planner.runs()) run_bytes += r.bytes;
      EXPECT_EQ(run_bytes, fill);
      auto run_descs = [&] {
        for (size_t i = c.desc_begin; i < c.desc_end; ++i) {
          std::memcpy(reinterpret_cast<void*>(descs[i].dst),
                      reinterpret_cast<const void*>(descs[i].src), descs[i].bytes);
        }
      };
      if (d2h) {
        run_descs();
        for (const StagingRun& r : planner.runs()) {
          std::memcpy(reinterpret_cast<void*>(r.host),
                      reinterpret_cast<const void*>(stage + r.offset), r.bytes);
        }
      } else {
        for (const StagingRun& r : planner.runs()) {
          std::memcpy(reinterpret_cast<void*>(stage + r.offset),
                      reinterpret_cast<const void*>(r.host), r.bytes);
        }
        run_descs();
      }
      planned += fill;
    }
    next_slot += chunks;
    EXPECT_FALSE(planner.overflowed());
    EXPECT_EQ(planned, total);
    EXPECT_EQ(chunks, StagingPlanner::ChunkCount(total, p.chunk_bytes));
    EXPECT_LE(planner.descs_used(), max);
    EXPECT_EQ(descs[max].pad, 0xdeadu);  // nothing written past the capacity given
    if (d2h) {
      EXPECT_TRUE(host == want);
    } else {
      EXPECT_TRUE(gpu == gpu_before);
    }
  }
}

// A buffer below MaxDescs or a total above the segments' bytes is reported, never overrun.
TEST(StagingPlannerTest, ReportsOverflowInsteadOfWritingPastTheBuffer) {
  std::vector<CopySegment> segs = {{0x1000, 0x100000, 4096}, {0x9000, 0x200000, 4096}};
  StagingPlanner::Params p;
  p.chunk_bytes = 1 << 20;
  p.piece_bytes = 1024;
  p.staging = {0x7000000, 0x8000000};
  std::vector<PieceDesc> descs(5, PieceDesc{0, 0, 0, 7});
  StagingPlanner planner;
  planner.Begin(segs, 8192, p, descs.data(), 4);  // needs 8
  StagingChunk c;
  while (planner.Next(&c)) {
  }
  EXPECT_TRUE(planner.overflowed());
  EXPECT_EQ(descs[4].pad, 7u);
  std::vector<PieceDesc> more(10, PieceDesc{0, 0, 0, 7});
  planner.Begin(segs, 9000, p, more.data(), 9);  // claims more bytes than the segments hold
  while (planner.Next(&c)) {
  }
  EXPECT_TRUE(planner.overflowed());
  EXPECT_EQ(more[9].pad, 7u);
  EXPECT_EQ(StagingPlanner::MaxDescs(segs, 8192, p), 9u);
}

// A random layout (1-6 tensors, 1-3 groups, distinct tensors per group) and block spec over it.
struct RandomJob {
  KvLayoutSpec layout;
  BlockTransferSpec spec;
  uint64_t slots = 0;
};
RandomJob MakeRandomJob(std::mt19937& rng, uintptr_t gpu_base, uint64_t num_blocks,
                        uint64_t max_group_blocks) {
  RandomJob j;
  KvLayoutSpec& s = j.layout;
  const uint32_t tensors = 1 + rng() % 6, groups = 1 + rng() % 3;
  const uint64_t page = 16 * (1 + rng() % 16);
  const uint64_t stride = page + 16 * (rng() % 3);
  for (uint32_t t = 0; t < tensors; ++t) {
    s.tensors.push_back({gpu_base + t * num_blocks * stride, num_blocks, stride, page});
  }
  for (uint32_t g = 0; g < groups; ++g) {
    KvGroupLayout gl;
    std::vector<uint32_t> ts(tensors);
    std::iota(ts.begin(), ts.end(), 0);
    std::shuffle(ts.begin(), ts.end(), rng);
    for (uint32_t i = 0; i < 1 + rng() % tensors; ++i) {
      gl.refs.push_back({ts[i], rng() % 3 == 0 ? page - 16 * (rng() % (page / 16)) : page});
    }
    s.groups.push_back(gl);
  }
  s.blocks_per_chunk = 1 + rng() % 4;
  s.num_workers = 1 + rng() % 2;
  s.worker_index = rng() % s.num_workers;
  s.host_page_size = 64;
  // Distinct block ids (a load's destinations never overlap, so any copy order gives the same
  // bytes), in runs of 1-3 consecutive ids so that segments merge across blocks.
  std::vector<std::vector<int64_t>> runs;
  for (uint64_t b = 0; b < num_blocks;) {
    std::vector<int64_t>& run = runs.emplace_back();
    for (uint64_t k = 1 + rng() % 3; k > 0 && b < num_blocks; --k) {
      run.push_back(static_cast<int64_t>(b++));
    }
  }
  std::shuffle(runs.begin(), runs.end(), rng);
  std::vector<int64_t> ids;
  for (const auto& run : runs) ids.insert(ids.end(), run.begin(), run.end());
  size_t next = 0;
  for (uint32_t g = 0; g < groups; ++g) {
    const uint32_t n = rng() % (max_group_blocks + 1);
    const uint64_t index = rng() % 8;
    j.spec.group_sizes.push_back(n);
    j.spec.block_indices.push_back(index);
    for (uint32_t i = 0; i < n; ++i) j.spec.gpu_block_ids.push_back(ids.at(next++));
    const uint64_t bpc = s.blocks_per_chunk;
    j.slots += n == 0 ? 0 : (index % bpc + n + bpc - 1) / bpc;
  }
  return j;
}

// The incremental expansion equals the whole job's (ExpandBlockSpec, OrderByHost, then merged),
// whatever sizes it is asked for, with ascending and with shuffled CPU slots.
TEST(HostRowExpanderTest, SameSegmentsAsTheWholeJobInHostOrder) {
  const uint32_t seed = 151515;
  std::mt19937 rng(seed);
  HostRowExpander ex;  // reused, as the engine does
  for (int iter = 0; iter < 300; ++iter) {
    SCOPED_TRACE("seed " + std::to_string(seed) + " iter " + std::to_string(iter));
    RandomJob j = MakeRandomJob(rng, 0x1000000, 64, 12);
    auto layout = KvLayout::Create(j.layout);
    ASSERT_TRUE(layout.ok()) << layout.status().ToString();
    HostRegion region{0x40000000, 256, layout->row_stride()};
    std::vector<int64_t> slots(256);
    std::iota(slots.begin(), slots.end(), 0);
    const bool shuffled = iter % 2 == 1;
    if (shuffled) std::shuffle(slots.begin(), slots.end(), rng);
    j.spec.cpu_slots.assign(slots.begin(), slots.begin() + static_cast<std::ptrdiff_t>(j.slots));
    for (auto dir : {TransferDirection::kGpuToCpu, TransferDirection::kCpuToGpu}) {
      const bool d2h = dir == TransferDirection::kGpuToCpu;
      std::vector<CopySegment> want;
      ASSERT_TRUE(
          layout->ExpandBlockSpec(j.spec, region, dir, false, &want, ExpandOrder::kHostRow).ok());
      uint64_t bytes = 0, pieces = 0;
      for (const CopySegment& s : want) {
        bytes += s.bytes;
        pieces += (s.bytes + 99) / 100;
      }
      const size_t unmerged = want.size();
      HostOrderScratch scratch;
      ASSERT_TRUE(OrderByHost(&want, d2h, &scratch).ok());
      CoalesceSegments(&want);
      ASSERT_TRUE(ex.Begin(*layout, j.spec, region, dir).ok());
      EXPECT_EQ(ex.total_bytes(), bytes);
      EXPECT_EQ(ex.segments(), unmerged);
      EXPECT_EQ(ex.MaxPieces(100), pieces);
      if (!shuffled) {
        EXPECT_FALSE(ex.sorted_rows());  // ascending slots: no sort
      }
      EXPECT_EQ(ex.CountSegments(UINT64_MAX - 1), want.size());
      if (!want.empty()) {
        EXPECT_EQ(ex.CountSegments(want.size() - 1), want.size());  // stops past the cap
      }
      std::vector<CopySegment> got;
      uint64_t filled = 0;
      while (!ex.done()) {
        const uint64_t ask = rng() % 4 == 0 ? 0 : rng() % 2000;
        const size_t before = got.size();
        const uint64_t n = ex.Fill(&got, ask);
        uint64_t appended = 0;
        for (size_t i = before; i < got.size(); ++i) appended += got[i].bytes;
        EXPECT_EQ(n, appended);
        if (!ex.done()) {
          EXPECT_GE(n, ask);
        }
        filled += n;
      }
      EXPECT_EQ(filled, bytes);
      EXPECT_EQ(got, want);
    }
  }
}

// Plans fed by the expander, executed with memcpy on real memory ("GPU" tensors in one buffer,
// the host region in another): every byte equals a direct copy of the spec's segments, in both
// directions, with shuffled slots and many chunks.
TEST(HostRowExpanderTest, IncrementalPlansExecuteByteExact) {
  const uint32_t seed = 2026;
  std::mt19937 rng(seed);
  StagingPlanner planner;
  HostRowExpander ex;
  uint64_t next_slot = 0;
  for (int iter = 0; iter < 40; ++iter) {
    SCOPED_TRACE("seed " + std::to_string(seed) + " iter " + std::to_string(iter));
    const uint64_t num_blocks = 128;
    std::vector<uint8_t> gpu(6 * num_blocks * (256 + 32) + 64);
    const uintptr_t gpu_base = (reinterpret_cast<uintptr_t>(gpu.data()) + 15) / 16 * 16;
    RandomJob j = MakeRandomJob(rng, gpu_base, num_blocks, 40);
    auto layout = KvLayout::Create(j.layout);
    ASSERT_TRUE(layout.ok()) << layout.status().ToString();
    const uint64_t num_slots = j.slots + 8;
    std::vector<uint8_t> host(num_slots * layout->row_stride() + 16);
    const uintptr_t host_base = (reinterpret_cast<uintptr_t>(host.data()) + 15) / 16 * 16;
    HostRegion region{host_base, num_slots, layout->row_stride()};
    std::vector<int64_t> slots(num_slots);
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), rng);
    j.spec.cpu_slots.assign(slots.begin(), slots.begin() + static_cast<std::ptrdiff_t>(j.slots));
    for (auto dir : {TransferDirection::kGpuToCpu, TransferDirection::kCpuToGpu}) {
      const bool d2h = dir == TransferDirection::kGpuToCpu;
      for (size_t i = 0; i < gpu.size(); ++i) gpu[i] = static_cast<uint8_t>(rng());
      for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<uint8_t>(rng());
      // The expected result: the segments copied one by one.
      std::vector<CopySegment> segs;
      ASSERT_TRUE(layout->ExpandBlockSpec(j.spec, region, dir, false, &segs).ok());
      std::vector<uint8_t> want_gpu = gpu, want_host = host;
      auto at = [&](uintptr_t a, std::vector<uint8_t>& g, std::vector<uint8_t>& h) -> uint8_t* {
        const uintptr_t gb = reinterpret_cast<uintptr_t>(gpu.data());
        const uintptr_t hb = reinterpret_cast<uintptr_t>(host.data());
        if (a >= gb && a < gb + gpu.size()) return g.data() + (a - gb);
        return h.data() + (a - hb);
      };
      for (const CopySegment& s : segs) {
        std::memcpy(at(s.dst, want_gpu, want_host), at(s.src, want_gpu, want_host), s.bytes);
      }
      ASSERT_TRUE(ex.Begin(*layout, j.spec, region, dir).ok());
      if (ex.total_bytes() == 0) continue;
      StagingPlanner::Params p;
      p.chunk_bytes = 512 * (1 + rng() % 8);  // many chunks
      p.piece_bytes = 16 * (1 + rng() % 20);
      std::vector<uint8_t> stage0(p.chunk_bytes), stage1(p.chunk_bytes);
      p.staging = {reinterpret_cast<uintptr_t>(stage0.data()),
                   reinterpret_cast<uintptr_t>(stage1.data())};
      p.first_slot = next_slot;
      p.d2h = d2h;
      const size_t max = StagingPlanner::MaxDescs(ex.MaxPieces(p.piece_bytes), ex.total_bytes(), p);
      std::vector<PieceDesc> descs(max + 1, PieceDesc{0, 0, 0, 0xdead});
      planner.Begin(&ex, ex.total_bytes(), p, descs.data(), max);
      StagingChunk c;
      size_t chunks = 0;
      uint64_t planned = 0;
      while (planner.Next(&c)) {
        ++chunks;
        const uintptr_t stage = p.staging[c.slot];
        uint64_t fill = 0;
        for (size_t i = c.desc_begin; i < c.desc_end; ++i) fill += descs[i].bytes;
        auto run_descs = [&] {
          for (size_t i = c.desc_begin; i < c.desc_end; ++i) {
            std::memcpy(reinterpret_cast<void*>(descs[i].dst),
                        reinterpret_cast<const void*>(descs[i].src), descs[i].bytes);
          }
        };
        if (d2h) run_descs();
        for (const StagingRun& r : planner.runs()) {
          if (d2h) {
            std::memcpy(reinterpret_cast<void*>(r.host),
                        reinterpret_cast<const void*>(stage + r.offset), r.bytes);
          } else {
            std::memcpy(reinterpret_cast<void*>(stage + r.offset),
                        reinterpret_cast<const void*>(r.host), r.bytes);
          }
        }
        if (!d2h) run_descs();
        planned += fill;
      }
      next_slot += chunks;
      EXPECT_FALSE(planner.overflowed());
      EXPECT_EQ(planned, ex.total_bytes());
      EXPECT_EQ(chunks, StagingPlanner::ChunkCount(ex.total_bytes(), p.chunk_bytes));
      EXPECT_EQ(descs[max].pad, 0xdeadu);
      EXPECT_TRUE(gpu == want_gpu);
      EXPECT_TRUE(host == want_host);
    }
  }
}

// A bad block id in the job's last chunk (or a bad slot, or counts that do not add up) fails
// Begin, before any segment exists: Fill then yields nothing, CountSegments counts nothing, and a
// planner fed by it plans no chunk — nothing to enqueue, nothing to report as a success. An
// expander that held a good job before is reset by the failed Begin.
TEST(HostRowExpanderTest, ABadBlockInTheLastChunkFailsBeforeAnySegment) {
  KvLayoutSpec s;
  s.tensors = {{0x100000, 100, 4096, 4096}, {0x800000, 60, 4096, 4096}};
  s.groups = {{{{0, 4096}}}, {{{0, 4096}, {1, 2048}}}};
  s.blocks_per_chunk = 4;
  auto layout = KvLayout::Create(s);
  ASSERT_TRUE(layout.ok());
  HostRegion region{0x40000000, 1000, layout->row_stride()};
  BlockTransferSpec spec;
  spec.group_sizes = {400, 400};
  for (int64_t i = 0; i < 800; ++i) spec.gpu_block_ids.push_back(i % 50);
  for (int64_t i = 0; i < 200; ++i) spec.cpu_slots.push_back(i);
  HostRowExpander ex;
  ASSERT_TRUE(ex.Begin(*layout, spec, region, TransferDirection::kGpuToCpu).ok());
  std::vector<CopySegment> out;
  ex.Fill(&out, 4096);  // half-way through a good job
  ASSERT_FALSE(out.empty());
  ASSERT_FALSE(ex.done());

  // Block 60 is inside tensor 0 (100 blocks) but not tensor 1 (60), which group 1 also names.
  BlockTransferSpec bad = spec;
  bad.gpu_block_ids.back() = 60;
  StagingPlanner::Params p;
  p.staging = {0x7000000, 0x8000000};
  std::vector<PieceDesc> descs(4096, PieceDesc{0, 0, 0, 7});
  for (auto dir : {TransferDirection::kGpuToCpu, TransferDirection::kCpuToGpu}) {
    Status st = ex.Begin(*layout, bad, region, dir);
    EXPECT_EQ(st.code(), StatusCode::kOutOfRange) << st.ToString();
    EXPECT_NE(st.message().find("GPU block 60 of group 1 outside tensor 1"), std::string::npos)
        << st.ToString();
    // ExpandBlockSpec reports the same error.
    std::vector<CopySegment> whole;
    EXPECT_EQ(
        layout->ExpandBlockSpec(bad, region, dir, true, &whole, ExpandOrder::kHostRow).ToString(),
        st.ToString());
    EXPECT_TRUE(ex.done());
    EXPECT_EQ(ex.total_bytes(), 0u);
    out.clear();
    EXPECT_EQ(ex.Fill(&out, UINT64_MAX), 0u);
    EXPECT_TRUE(out.empty());
    EXPECT_EQ(ex.CountSegments(UINT64_MAX - 1), 0u);
    StagingPlanner planner;
    planner.Begin(&ex, ex.total_bytes(), p, descs.data(), descs.size());
    StagingChunk c;
    EXPECT_FALSE(planner.Next(&c));
    EXPECT_EQ(planner.descs_used(), 0u);
  }
  EXPECT_EQ(descs[0].pad, 7u);  // no descriptor written
  // A negative id, a slot outside the region, and slot counts that do not add up, the same way.
  bad = spec;
  bad.gpu_block_ids.back() = -1;
  EXPECT_EQ(ex.Begin(*layout, bad, region, TransferDirection::kCpuToGpu).code(),
            StatusCode::kOutOfRange);
  bad = spec;
  bad.cpu_slots.back() = 1000;
  EXPECT_EQ(ex.Begin(*layout, bad, region, TransferDirection::kCpuToGpu).code(),
            StatusCode::kOutOfRange);
  bad = spec;
  bad.cpu_slots.pop_back();
  EXPECT_EQ(ex.Begin(*layout, bad, region, TransferDirection::kCpuToGpu).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(ex.done());
}

}  // namespace
}  // namespace kvo
