// Transfer benchmarks (`kvo bench transfer`). Each case reports MB/s against a baseline measured in
// the same run. Structure: RunTransferBench calls one function per engine; the host cases are
// RunHostTransferCases (the baseline is one large memcpy of the same bytes, target >= 80 %); the
// CUDA engine adds its cases as another function beside it.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench.h"
#include "transfer/transfer.h"

namespace kvo::bench {
namespace {

struct AlignedBuffer {
  explicit AlignedBuffer(uint64_t n) : bytes(n) {
    p = static_cast<uint8_t*>(std::aligned_alloc(4096, (n + 4095) / 4096 * 4096));
    std::memset(p, 1, n);
  }
  ~AlignedBuffer() { std::free(p); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  uintptr_t addr() const { return reinterpret_cast<uintptr_t>(p); }
  uint8_t* p;
  uint64_t bytes;
};

double Mb(double bytes_per_second) { return bytes_per_second / 1e6; }

int HostThreads() { return std::max(2, static_cast<int>(std::thread::hardware_concurrency())); }

// One large memcpy of `bytes` (the ceiling the host engine is compared with).
double MemcpyRate(uint64_t bytes, double seconds) {
  AlignedBuffer src(bytes), dst(bytes);
  return MeasureRate([&] { std::memcpy(dst.p, src.p, bytes); }, static_cast<double>(bytes),
                     seconds);
}

double EngineRate(TransferEngine& engine, const TransferRequest& request, uint64_t bytes,
                  double seconds) {
  std::vector<TransferResult> done;
  return MeasureRate(
      [&] {
        auto id = engine.Submit(request);
        if (!id.ok()) std::abort();
        engine.Wait(*id).IgnoreError();
        done.clear();
        engine.TakeFinished(&done);
      },
      static_cast<double>(bytes), seconds);
}

}  // namespace

int RunHostTransferCases(const BenchOptions& options) {
  const double secs = options.seconds_per_case;
  TransferEngineOptions eo;
  eo.num_threads = HostThreads();
  auto engine_or = MakeHostTransferEngine(eo);
  if (!engine_or.ok()) return 1;
  TransferEngine& engine = **engine_or;

  // 1. One contiguous copy.
  const uint64_t big = options.quick ? (16ull << 20) : (256ull << 20);
  {
    AlignedBuffer src(big), dst(big);
    TransferRequest req;
    req.segments = {{src.addr(), dst.addr(), big}};
    BenchResult r;
    r.area = "transfer";
    r.name = "host_contiguous_" + std::to_string(big >> 20) + "MiB";
    r.unit = "MB/s";
    r.value = Mb(EngineRate(engine, req, big, secs));
    r.baseline_name = "one memcpy of the same bytes";
    r.baseline = Mb(MemcpyRate(big, secs));
    r.target = 0.8 * r.baseline;
    r.notes = std::to_string(eo.num_threads) + " worker threads";
    PrintResult(r, options);
  }

  // 2. Scattered blocks: Llama-3-8B-like geometry (32 layers, K and V tensors), `seg` bytes per
  //    (block, tensor) segment, 64 random GPU blocks offloaded into 64 CPU slots per job.
  for (uint64_t seg : {8ull << 10, 32ull << 10, 64ull << 10, 256ull << 10}) {
    const int tensors = 64;
    const uint64_t gpu_blocks = options.quick ? 128 : 256;
    const uint64_t job_blocks = 64;
    std::vector<std::unique_ptr<AlignedBuffer>> kv;
    KvLayoutSpec spec;
    KvGroupLayout group;
    for (int t = 0; t < tensors; ++t) {
      kv.push_back(std::make_unique<AlignedBuffer>(gpu_blocks * seg));
      spec.tensors.push_back({kv.back()->addr(), gpu_blocks, seg, seg});
      group.refs.push_back({static_cast<uint32_t>(t), seg});
    }
    spec.groups = {group};
    auto layout = KvLayout::Create(spec);
    if (!layout.ok()) return 1;
    TransferEngineOptions eo2 = eo;
    auto e2 = MakeHostTransferEngine(eo2);
    if (!e2.ok()) return 1;
    auto region = (*e2)->AllocateHostRegion(job_blocks, layout->row_stride());
    if (!region.ok() || !(*e2)->RegisterLayout(*layout, *region).ok()) return 1;
    BlockTransferSpec bs;
    bs.group_sizes = {static_cast<uint32_t>(job_blocks)};
    for (uint64_t i = 0; i < job_blocks; ++i) {
      bs.gpu_block_ids.push_back(static_cast<int64_t>((i * 37 + 11) % gpu_blocks));
      bs.cpu_slots.push_back(static_cast<int64_t>(job_blocks - 1 - i));
    }
    const uint64_t bytes = job_blocks * tensors * seg;
    for (auto dir : {TransferDirection::kGpuToCpu, TransferDirection::kCpuToGpu}) {
      TransferRequest req;
      req.direction = dir;
      req.blocks = bs;
      BenchResult r;
      r.area = "transfer";
      r.name = "host_blocks_" + std::to_string(seg >> 10) + "KiB_" +
               std::string(TransferDirectionName(dir));
      r.unit = "MB/s";
      r.value = Mb(EngineRate(**e2, req, bytes, secs));
      r.baseline_name = "one memcpy of the same bytes";
      r.baseline = Mb(MemcpyRate(bytes, secs));
      r.target = 0.8 * r.baseline;
      r.notes = std::to_string(job_blocks) + " blocks x " + std::to_string(tensors) +
                " tensors per job, " + std::to_string(eo.num_threads) + " worker threads";
      PrintResult(r, options);
    }
  }
  return 0;
}

int RunTransferBench(const BenchOptions& options) {
  const int plan = RunStagingPlanCases(options);
  return RunHostTransferCases(options) | plan;
}

}  // namespace kvo::bench
