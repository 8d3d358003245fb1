// The CUDA TransferEngine against the real GPU: byte-exact GPU -> CPU -> GPU round trips for
// several page sizes, several KV groups and partial chunks, every copy method; copies ordered
// after pending compute-stream writes; poisoned destinations so an unwritten or stray byte shows.
// Every test that needs a device GTEST_SKIPs without one (CI); the method choice and the
// no-device error run everywhere.
#include "transfer/cuda/cuda_engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "tests/testing/temp_dir.h"
#include "transfer/kv_layout.h"

namespace kvo::cuda {
namespace {

constexpr uint8_t kHostPoison = 0xA5;
constexpr uint8_t kDevicePoison = 0x5A;

#define SKIP_WITHOUT_DEVICE()                                          \
  do {                                                                 \
    Status device_status = CheckDevice(0);                             \
    if (!device_status.ok()) GTEST_SKIP() << device_status.ToString(); \
  } while (0)

// A device KV cache of `tensors` tensors laid out back to back, a pinned host region, and a host
// mirror of both for computing the expected bytes.
struct Fixture {
  std::unique_ptr<TransferEngine> engine;
  DeviceBuffer device;
  std::vector<uint8_t> device_mirror;  // what the device holds
  HostRegion region;
  std::unique_ptr<KvLayout> layout;
};

std::vector<uint8_t> RandomBytes(uint64_t n, std::mt19937_64& rng) {
  std::vector<uint8_t> v(n);
  for (uint64_t i = 0; i + 8 <= n; i += 8) {
    uint64_t x = rng();
    std::memcpy(&v[i], &x, 8);
  }
  for (uint64_t i = n - n % 8; i < n; ++i) v[i] = static_cast<uint8_t>(rng());
  return v;
}

// Builds the fixture for `spec` (tensor bases are filled in here: tensor t at device offset
// t * num_blocks * block_stride).
void Build(KvLayoutSpec spec, uint64_t num_slots, const std::string& method, std::mt19937_64& rng,
           Fixture* f, uintptr_t compute_stream = 0, const CudaEngineTuning& tuning = {}) {
  uint64_t bytes = 0;
  for (const auto& t : spec.tensors) bytes += t.num_blocks * t.block_stride;
  auto dev = DeviceBuffer::Allocate(bytes);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  f->device = std::move(*dev);
  uint64_t offset = 0;
  for (auto& t : spec.tensors) {
    t.base = f->device.addr() + offset;
    offset += t.num_blocks * t.block_stride;
  }
  f->device_mirror = RandomBytes(bytes, rng);
  ASSERT_TRUE(CopyHostToDevice(f->device.addr(), f->device_mirror.data(), bytes).ok());

  auto layout = KvLayout::Create(spec);
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  f->layout = std::make_unique<KvLayout>(std::move(*layout));

  TransferEngineOptions options;
  options.copy_method = method;
  options.compute_stream = compute_stream;
  auto engine = MakeCudaTransferEngine(options, tuning);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  f->engine = std::move(*engine);
  auto region = f->engine->AllocateHostRegion(num_slots, f->layout->row_stride());
  ASSERT_TRUE(region.ok()) << region.status().ToString();
  f->region = *region;
  std::memset(reinterpret_cast<void*>(f->region.base), kHostPoison, f->region.bytes());
  ASSERT_TRUE(f->engine->RegisterLayout(*f->layout, f->region).ok());
}

// Runs one job to completion; checks its result.
void RunJob(TransferEngine* engine, TransferRequest request, uint64_t expect_bytes) {
  auto id = engine->Submit(std::move(request));
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  ASSERT_TRUE(engine->Wait(*id).ok());
  std::vector<TransferResult> results;
  engine->TakeFinished(&results);
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].job_id, *id);
  EXPECT_TRUE(results[0].success) << results[0].status.ToString();
  EXPECT_EQ(results[0].bytes, expect_bytes);
  EXPECT_GT(results[0].seconds, 0.0);
}

// Store `spec` GPU -> CPU and check every host byte; poison the device, load it back and check
// every device byte.
void RoundTrip(Fixture* f, const BlockTransferSpec& spec) {
  const uintptr_t dev_base = f->device.addr();
  const uintptr_t host_base = f->region.base;
  std::vector<CopySegment> store;
  ASSERT_TRUE(f->layout
                  ->ExpandBlockSpec(spec, f->region, TransferDirection::kGpuToCpu,
                                    /*coalesce=*/false, &store)
                  .ok());
  uint64_t bytes = 0;
  std::vector<uint8_t> expect_host(f->region.bytes(), kHostPoison);
  for (const CopySegment& s : store) {
    bytes += s.bytes;
    std::memcpy(&expect_host[s.dst - host_base], &f->device_mirror[s.src - dev_base], s.bytes);
  }

  TransferRequest req;
  req.direction = TransferDirection::kGpuToCpu;
  req.blocks = spec;
  RunJob(f->engine.get(), req, bytes);
  const uint8_t* host = reinterpret_cast<const uint8_t*>(host_base);
  ASSERT_EQ(std::memcmp(host, expect_host.data(), expect_host.size()), 0)
      << "host region differs from the expected rows";

  // Load back into a poisoned device.
  ASSERT_TRUE(FillDevice(dev_base, kDevicePoison, f->device_mirror.size()).ok());
  std::vector<uint8_t> expect_dev(f->device_mirror.size(), kDevicePoison);
  for (const CopySegment& s : store) {
    std::memcpy(&expect_dev[s.src - dev_base], &f->device_mirror[s.src - dev_base], s.bytes);
  }
  req.direction = TransferDirection::kCpuToGpu;
  RunJob(f->engine.get(), req, bytes);
  std::vector<uint8_t> got(f->device_mirror.size());
  ASSERT_TRUE(CopyDeviceToHost(got.data(), dev_base, got.size()).ok());
  size_t mismatch = 0;
  while (mismatch < got.size() && got[mismatch] == expect_dev[mismatch]) ++mismatch;
  ASSERT_EQ(mismatch, got.size()) << "device byte " << mismatch << " differs after the load";
}

std::vector<int64_t> DistinctIds(uint64_t n, uint64_t range, std::mt19937_64& rng) {
  std::vector<int64_t> all(range);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(n);
  return all;
}

class CudaEngineMethodTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaEngineMethodTest, RoundTripSeveralPageSizes) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937_64 rng(::kvo::testing::TestSeed());
  for (uint64_t page : {8u << 10, 32u << 10, 64u << 10, 256u << 10}) {
    SCOPED_TRACE("page " + std::to_string(page));
    KvLayoutSpec spec;
    const uint64_t num_blocks = 48;
    for (int t = 0; t < 4; ++t) spec.tensors.push_back({0, num_blocks, page, page});
    spec.groups.push_back({{{0, page}, {1, page}, {2, page}, {3, page}}});
    Fixture f;
    Build(spec, 32, GetParam(), rng, &f);
    if (HasFatalFailure()) return;
    BlockTransferSpec bs;
    bs.gpu_block_ids = DistinctIds(20, num_blocks, rng);
    bs.group_sizes = {20};
    bs.cpu_slots = DistinctIds(20, 32, rng);
    RoundTrip(&f, bs);
  }
}

TEST_P(CudaEngineMethodTest, MultipleGroupsPartialChunksUnpaddedPages) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937_64 rng(::kvo::testing::TestSeed());
  KvLayoutSpec spec;
  // Group 0: two 32 KiB tensors (K, V); group 1: one tensor whose 16 KiB pages copy only
  // 16 KiB - 48 bytes (an unpadded page); a block stride larger than the page.
  spec.tensors.push_back({0, 40, 32 << 10, 32 << 10});
  spec.tensors.push_back({0, 40, 32 << 10, 32 << 10});
  spec.tensors.push_back({0, 40, 20 << 10, 16 << 10});
  spec.groups.push_back({{{0, 32 << 10}, {1, 32 << 10}}});
  spec.groups.push_back({{{2, (16 << 10) - 48}}});
  spec.blocks_per_chunk = 4;
  spec.num_workers = 2;
  spec.worker_index = 1;
  Fixture f;
  Build(spec, 12, GetParam(), rng, &f);
  if (HasFatalFailure()) return;
  BlockTransferSpec bs;
  // Group 0: 6 blocks starting at logical block 2 (skip 2: positions 2..7, two chunks);
  // group 1: 3 blocks starting at logical block 5 (skip 1: positions 1..3, one chunk).
  auto ids = DistinctIds(9, 40, rng);
  bs.gpu_block_ids = ids;
  bs.group_sizes = {6, 3};
  bs.block_indices = {2, 5};
  bs.cpu_slots = DistinctIds(3, 12, rng);
  RoundTrip(&f, bs);
}

TEST_P(CudaEngineMethodTest, RawSegmentsOddSizesAndManyJobsInOrder) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937_64 rng(::kvo::testing::TestSeed());
  KvLayoutSpec spec;
  spec.tensors.push_back({0, 64, 8 << 10, 8 << 10});
  spec.groups.push_back({{{0, 8 << 10}}});
  Fixture f;
  Build(spec, 64, GetParam(), rng, &f);
  if (HasFatalFailure()) return;
  // Raw segments with sizes and offsets that are not multiples of 16 (byte path of the kernels).
  std::vector<uint64_t> ids;
  std::vector<JobId> jobs;
  std::vector<uint8_t> expect(f.region.bytes(), kHostPoison);
  for (int j = 0; j < 8; ++j) {
    TransferRequest req;
    req.direction = TransferDirection::kGpuToCpu;
    for (int k = 0; k < 4; ++k) {
      uint64_t block = static_cast<uint64_t>(j * 4 + k);
      uint64_t off = rng() % 100, n = 1 + rng() % 5000;
      CopySegment s{f.device.addr() + block * (8 << 10) + off,
                    f.region.base + block * f.region.row_stride + 3 + off, n};
      std::memcpy(&expect[s.dst - f.region.base], &f.device_mirror[s.src - f.device.addr()], n);
      req.segments.push_back(s);
    }
    auto id = f.engine->Submit(req);
    ASSERT_TRUE(id.ok()) << id.status().ToString();
    jobs.push_back(*id);
  }
  f.engine->Drain();
  std::vector<TransferResult> results;
  f.engine->TakeFinished(&results);
  ASSERT_EQ(results.size(), jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    EXPECT_EQ(results[i].job_id, jobs[i]);
    EXPECT_TRUE(results[i].success);
  }
  EXPECT_EQ(std::memcmp(reinterpret_cast<const void*>(f.region.base), expect.data(), expect.size()),
            0);
  // Every result is returned once.
  results.clear();
  f.engine->TakeFinished(&results);
  EXPECT_TRUE(results.empty());
  EXPECT_EQ(f.engine->Wait(jobs[0]).code(), StatusCode::kNotFound);
}

// The offload must see what a kernel queued on the compute stream writes into its source blocks
// (after a delay, so a copy that did not wait would read the old bytes); the load must land after
// a pending compute write to its destination (write-after-write order).
TEST_P(CudaEngineMethodTest, CopiesWaitForPendingComputeStreamWrites) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937_64 rng(::kvo::testing::TestSeed());
  auto compute = Stream::Create();
  ASSERT_TRUE(compute.ok());
  const uint64_t page = 32 << 10, num_blocks = 16;
  KvLayoutSpec spec;
  spec.tensors.push_back({0, num_blocks, page, page});
  spec.groups.push_back({{{0, page}}});
  Fixture f;
  Build(spec, 16, GetParam(), rng, &f, compute->handle());
  if (HasFatalFailure()) return;

  const uint32_t fill_seed = static_cast<uint32_t>(rng());
  ASSERT_TRUE(LaunchDelayedFill(compute->handle(), f.device.addr(), num_blocks * page, fill_seed,
                                /*delay_ns=*/30'000'000)
                  .ok());
  BlockTransferSpec bs;
  bs.gpu_block_ids = {3, 7, 11};
  bs.group_sizes = {3};
  bs.cpu_slots = {9, 0, 4};
  TransferRequest req;
  req.direction = TransferDirection::kGpuToCpu;
  req.blocks = bs;
  RunJob(f.engine.get(), req, 3 * page);
  const uint8_t* host = reinterpret_cast<const uint8_t*>(f.region.base);
  for (size_t i = 0; i < 3; ++i) {
    const uint64_t block = static_cast<uint64_t>(bs.gpu_block_ids[i]);
    const uint8_t* row = host + static_cast<uint64_t>(bs.cpu_slots[i]) * f.region.row_stride;
    for (uint64_t b = 0; b < page; ++b) {
      ASSERT_EQ(row[b], DelayedFillPattern(fill_seed, block * page + b))
          << "block " << block << " byte " << b << ": the offload did not wait for compute";
    }
  }

  // Load: a compute kernel will overwrite the whole cache after a delay; the load queued after it
  // must win.
  std::vector<uint8_t> row_bytes = RandomBytes(page, rng);
  std::memcpy(reinterpret_cast<void*>(f.region.base + 5 * f.region.row_stride), row_bytes.data(),
              page);
  ASSERT_TRUE(LaunchDelayedFill(compute->handle(), f.device.addr(), num_blocks * page,
                                fill_seed + 1, 30'000'000)
                  .ok());
  TransferRequest load;
  load.direction = TransferDirection::kCpuToGpu;
  load.blocks = BlockTransferSpec{{2}, {1}, {}, {5}};
  RunJob(f.engine.get(), load, page);
  ASSERT_TRUE(compute->Synchronize().ok());
  std::vector<uint8_t> got(page);
  ASSERT_TRUE(CopyDeviceToHost(got.data(), f.device.addr() + 2 * page, page).ok());
  EXPECT_EQ(got, row_bytes) << "the load did not wait for the pending compute write";
}

// Staging with 1 MiB chunks: many chunks per job (ramped first/last chunks, both staging slots
// reused many times), with the idle kernel shape and, while the compute stream is busy, the busy
// shape.
TEST(CudaEngineStagingTest, ManyChunksBothShapesByteExact) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937_64 rng(::kvo::testing::TestSeed());
  CudaEngineTuning tuning;
  tuning.staging_chunk_bytes = 1 << 20;
  for (bool busy : {false, true}) {
    SCOPED_TRACE(busy ? "busy shape" : "idle shape");
    auto compute = Stream::Create();
    ASSERT_TRUE(compute.ok());
    KvLayoutSpec spec;
    const uint64_t page = 8 << 10, num_blocks = 256;
    KvGroupLayout group;
    for (uint32_t t = 0; t < 8; ++t) {
      spec.tensors.push_back({0, num_blocks, page, page});
      group.refs.push_back({t, page});
    }
    spec.groups.push_back(group);
    Fixture f;
    Build(spec, 200, "staging", rng, &f, compute->handle(), tuning);
    if (HasFatalFailure()) return;
    auto scratch = DeviceBuffer::Allocate(4096);
    ASSERT_TRUE(scratch.ok());
    if (busy) {
      // Keep the compute stream busy while the jobs are submitted (the kernel writes a scratch
      // buffer, not the KV cache).
      ASSERT_TRUE(LaunchDelayedFill(compute->handle(), scratch->addr(), 4096, 7, 50'000'000).ok());
    }
    BlockTransferSpec bs;
    bs.gpu_block_ids = DistinctIds(150, num_blocks, rng);  // 150 x 64 KiB: about 10 chunks
    bs.group_sizes = {150};
    bs.cpu_slots = DistinctIds(150, 200, rng);
    RoundTrip(&f, bs);
    ASSERT_TRUE(compute->Synchronize().ok());
  }
}

// A staging job of many chunks whose only bad block id is its very last one: the whole job is
// refused at Submit (no job id, nothing reported by TakeFinished) and neither side was written —
// the check is whole-job before chunk 0 is enqueued, though segments are generated per chunk.
TEST(CudaEngineStagingTest, BadBlockInTheLastChunkFailsTheWholeJobBeforeAnyCopy) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937_64 rng(::kvo::testing::TestSeed());
  CudaEngineTuning tuning;
  tuning.staging_chunk_bytes = 1 << 20;
  KvLayoutSpec spec;
  const uint64_t page = 8 << 10, num_blocks = 256;
  KvGroupLayout group;
  for (uint32_t t = 0; t < 8; ++t) {
    spec.tensors.push_back({0, num_blocks, page, page});
    group.refs.push_back({t, page});
  }
  spec.groups = {group, group};
  Fixture f;
  Build(spec, 200, "staging", rng, &f, 0, tuning);
  if (HasFatalFailure()) return;
  BlockTransferSpec bs;
  bs.gpu_block_ids = DistinctIds(150, num_blocks, rng);  // about 10 chunks of 1 MiB
  bs.group_sizes = {75, 75};
  bs.cpu_slots = DistinctIds(150, 200, rng);
  bs.gpu_block_ids.back() = static_cast<int64_t>(num_blocks);  // one past the tensors
  for (auto dir : {TransferDirection::kGpuToCpu, TransferDirection::kCpuToGpu}) {
    SCOPED_TRACE(std::string(TransferDirectionName(dir)));
    TransferRequest req;
    req.direction = dir;
    req.blocks = bs;
    auto id = f.engine->Submit(req);
    ASSERT_FALSE(id.ok());
    EXPECT_EQ(id.status().code(), StatusCode::kOutOfRange) << id.status().ToString();
    EXPECT_NE(id.status().message().find("GPU block 256"), std::string::npos);
    f.engine->Drain();
    std::vector<TransferResult> results;
    f.engine->TakeFinished(&results);
    EXPECT_TRUE(results.empty());
    const uint8_t* host = reinterpret_cast<const uint8_t*>(f.region.base);
    size_t touched = 0;
    for (uint64_t i = 0; i < f.region.bytes(); ++i) touched += host[i] != kHostPoison;
    EXPECT_EQ(touched, 0u) << "host bytes written by a refused job";
    std::vector<uint8_t> got(f.device_mirror.size());
    ASSERT_TRUE(CopyDeviceToHost(got.data(), f.device.addr(), got.size()).ok());
    EXPECT_TRUE(got == f.device_mirror) << "device bytes written by a refused job";
  }
  // The engine still works after the refusal: the job with a valid last block round-trips (a
  // repeated block id is fine: the load writes it twice with the same bytes).
  bs.gpu_block_ids.back() = 0;
  RoundTrip(&f, bs);
}

INSTANTIATE_TEST_SUITE_P(Methods, CudaEngineMethodTest,
                         ::testing::Values("staging", "kernel", "batch", "dma", "auto"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

TEST(CudaEngineTest, KernelMethodRejectsPageableHostMemory) {
  SKIP_WITHOUT_DEVICE();
  TransferEngineOptions options;
  options.copy_method = "kernel";
  auto engine = MakeCudaTransferEngine(options);
  ASSERT_TRUE(engine.ok());
  auto dev = DeviceBuffer::Allocate(4096);
  ASSERT_TRUE(dev.ok());
  std::vector<uint8_t> pageable(4096);
  TransferRequest req;
  req.direction = TransferDirection::kGpuToCpu;
  req.segments = {{dev->addr(), reinterpret_cast<uintptr_t>(pageable.data()), 4096}};
  auto id = (*engine)->Submit(req);
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(id.status().message().find("pinned"), std::string::npos);
  // Empty jobs and block specs without a layout are errors, no job made.
  EXPECT_FALSE((*engine)->Submit(TransferRequest{}).ok());
  TransferRequest blocks;
  blocks.blocks = BlockTransferSpec{{0}, {1}, {}, {0}};
  EXPECT_EQ((*engine)->Submit(blocks).status().code(), StatusCode::kFailedPrecondition);
}

TEST(CudaEngineTest, AutoPicksStagingWhenComputeIsBusyAndKernelForSmallIdleJobs) {
  SKIP_WITHOUT_DEVICE();
  auto compute = Stream::Create();
  ASSERT_TRUE(compute.ok());
  TransferEngineOptions options;
  options.compute_stream = compute->handle();
  auto engine = MakeCudaTransferEngine(options);
  ASSERT_TRUE(engine.ok());
  auto region = (*engine)->AllocateHostRegion(64, 64 << 10);
  ASSERT_TRUE(region.ok());
  auto dev = DeviceBuffer::Allocate(64 << 20);
  ASSERT_TRUE(dev.ok());
  auto job = [&](uint64_t n, uint64_t seg) {
    TransferRequest req;
    req.direction = TransferDirection::kGpuToCpu;
    for (uint64_t i = 0; i < n; ++i) {
      req.segments.push_back({dev->addr() + i * 2 * seg, region->base + i * seg, seg});
    }
    auto id = (*engine)->Submit(req);
    EXPECT_TRUE(id.ok());
    auto m = JobMethod(engine->get(), *id);
    EXPECT_TRUE(m.ok());
    EXPECT_TRUE((*engine)->Wait(*id).ok());
    return *m;
  };
  EXPECT_EQ(job(4, 16 << 10), CopyMethod::kKernel);    // 64 KiB, idle
  EXPECT_EQ(job(64, 32 << 10), CopyMethod::kStaging);  // 2 MiB of 32 KiB segments
  ASSERT_TRUE(
      LaunchDelayedFill(compute->handle(), dev->addr() + (32 << 20), 4096, 1, 20'000'000).ok());
  EXPECT_EQ(job(4, 16 << 10), CopyMethod::kStaging);  // small, but the GPU is busy
  std::vector<TransferResult> results;
  (*engine)->TakeFinished(&results);
  EXPECT_EQ(results.size(), 3u);
}

// Runs everywhere: the choice itself, and the error without a device.
TEST(CudaEngineTest, ChooseCopyMethodRules) {
  CudaEngineTuning t;
  EXPECT_EQ(ChooseCopyMethod(t, 256 << 20, 128, false, true), CopyMethod::kBatch);  // 2 MiB segs
  EXPECT_EQ(ChooseCopyMethod(t, 256 << 20, 8192, false, true), CopyMethod::kStaging);
  EXPECT_EQ(ChooseCopyMethod(t, 256 << 20, 8192, true, true), CopyMethod::kStaging);
  EXPECT_EQ(ChooseCopyMethod(t, 64 << 10, 4, false, true), CopyMethod::kKernel);
  EXPECT_EQ(ChooseCopyMethod(t, 64 << 10, 4, true, true), CopyMethod::kStaging);
  EXPECT_EQ(ChooseCopyMethod(t, 64 << 10, 4, false, false), CopyMethod::kBatch);  // pageable
  EXPECT_EQ(ParseCopyMethod("staging").value(), CopyMethod::kStaging);
  EXPECT_EQ(ParseCopyMethod("fast").status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(ParseCopyMethod("fast").status().message().find("'fast'"), std::string::npos);
}

TEST(CudaEngineTest, WithoutDeviceEveryEntryPointIsUnavailable) {
  if (CheckDevice(0).ok()) GTEST_SKIP() << "a device is present";
  EXPECT_EQ(CheckDevice(0).code(), StatusCode::kUnavailable);
  auto engine = MakeCudaTransferEngine(TransferEngineOptions{});
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), StatusCode::kUnavailable);
  EXPECT_FALSE(DeviceBuffer::Allocate(4096).ok());
  EXPECT_FALSE(Stream::Create().ok());
}

TEST(CudaEngineTest, BadCopyMethodAndTuningAreInvalidArgument) {
  TransferEngineOptions options;
  options.copy_method = "zero";
  EXPECT_EQ(MakeCudaTransferEngine(options).status().code(), StatusCode::kInvalidArgument);
  CudaEngineTuning tuning;
  tuning.threads = 100;
  EXPECT_EQ(MakeCudaTransferEngine(TransferEngineOptions{}, tuning).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvo::cuda
