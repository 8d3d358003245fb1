// The GPU cases of `kvo bench transfer` (registered when kvo_transfer_cuda is linked). Every
// figure is set against a baseline measured in the same run:
//   - contiguous pinned copies (one cudaMemcpyAsync of the job's bytes) each way and both ways at
//     once: the ceilings;
//   - scattered KV blocks (8, 32, 64, 256 KiB segments, random GPU blocks, random CPU rows) per
//     copy method through the real engine and block specs, each direction, as a ratio to the
//     ceiling (naive per-segment dma is the baseline method), data verified once per case;
//   - offload and load at once against the duplex ceiling;
//   - under load: short full-occupancy compute kernels back to back on the compute stream; the
//     copy's ratio to the ceiling and the compute kernels' slowdown, per method;
//   - which method `auto` picked, idle and busy.
// Without a device the cases print one note to stderr and are skipped.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "transfer/cuda/cuda_engine.h"
#include "transfer/kv_layout.h"

namespace kvo::bench {
namespace {

using cuda::CopyMethod;
using cuda::CopyMethodName;

constexpr double kGB = 1e9;
constexpr uint32_t kFillSeed = 0x5eed;

double Median(std::vector<double> v) { return Percentile(std::move(v), 50); }

struct Ctx {
  BenchOptions options;
  uint64_t job_bytes = 0;
  int reps = 0;
  int sms = 0;
  cuda::DeviceBuffer device;  // 2 jobs' worth of KV blocks + slack
  cuda::PinnedBuffer host;    // 2 jobs' worth of CPU rows + slack
  cuda::Stream s1, s2;
  cuda::Stream compute;     // the engine's compute stream (under-load cases run kernels here)
  cuda::DeviceBuffer sink;  // busy-kernel output
  std::mt19937_64 rng{12345};
};

#define BENCH_OK(expr)                                                  \
  do {                                                                  \
    ::kvo::Status bench_status_ = (expr);                               \
    if (!bench_status_.ok()) {                                          \
      std::fprintf(stderr, "kvo bench transfer (gpu): %s: %s\n", #expr, \
                   bench_status_.ToString().c_str());                   \
      return bench_status_;                                             \
    }                                                                   \
  } while (0)

void Print(const Ctx& c, std::string name, std::string unit, double value,
           std::string baseline_name, double baseline, double target, std::string notes) {
  BenchResult r;
  r.area = "transfer";
  r.name = std::move(name);
  r.unit = std::move(unit);
  r.value = value;
  r.baseline_name = std::move(baseline_name);
  r.baseline = baseline;
  r.target = target;
  r.notes = std::move(notes);
  PrintResult(r, c.options);
}

// ---- ceilings ------------------------------------------------------------------------------

Result<double> ContiguousGBps(Ctx& c, bool d2h) {
  KVO_ASSIGN_OR_RETURN(cuda::Event e0, cuda::Event::Create());
  KVO_ASSIGN_OR_RETURN(cuda::Event e1, cuda::Event::Create());
  uintptr_t dev = c.device.addr(), host = reinterpret_cast<uintptr_t>(c.host.data());
  std::vector<double> gbps;
  for (int i = 0; i < c.reps + 2; ++i) {
    BENCH_OK(e0.Record(c.s1.handle()));
    BENCH_OK(cuda::CopyAsync(c.s1.handle(), d2h ? host : dev, d2h ? dev : host, c.job_bytes));
    BENCH_OK(e1.Record(c.s1.handle()));
    BENCH_OK(e1.Synchronize());
    KVO_ASSIGN_OR_RETURN(double ms, e1.MillisSince(e0));
    if (i >= 2) gbps.push_back(static_cast<double>(c.job_bytes) / (ms * 1e-3) / kGB);
  }
  return Median(gbps);
}

// Both directions at once (different halves of the buffers), host wall clock around both.
Result<double> DuplexGBps(Ctx& c) {
  uintptr_t dev = c.device.addr(), host = reinterpret_cast<uintptr_t>(c.host.data());
  std::vector<double> gbps;
  for (int i = 0; i < c.reps + 2; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    BENCH_OK(cuda::CopyAsync(c.s1.handle(), host, dev, c.job_bytes));
    BENCH_OK(cuda::CopyAsync(c.s2.handle(), dev + c.job_bytes, host + c.job_bytes, c.job_bytes));
    BENCH_OK(c.s1.Synchronize());
    BENCH_OK(c.s2.Synchronize());
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i >= 2) gbps.push_back(2.0 * static_cast<double>(c.job_bytes) / s / kGB);
  }
  return Median(gbps);
}

// ---- scattered KV blocks through the engine ------------------------------------------------

struct Geometry {
  uint64_t segment;  // page bytes of one tensor's block
  uint32_t tensors;  // segments per block (layers x K/V)
};

struct Setup {
  std::unique_ptr<TransferEngine> engine;
  std::unique_ptr<KvLayout> layout;
  HostRegion region;
  BlockTransferSpec a, b;  // two disjoint jobs (different GPU blocks and CPU rows)
  uint64_t blocks_in_device = 0;
};

Result<Setup> MakeSetup(Ctx& c, const Geometry& g, const std::string& method, uintptr_t compute,
                        const cuda::CudaEngineTuning& tuning = {}) {
  Setup s;
  const uint64_t block_bytes = g.segment * g.tensors;
  const uint64_t job_blocks = std::max<uint64_t>(1, c.job_bytes / block_bytes);
  s.blocks_in_device = c.device.bytes() / block_bytes;
  KvLayoutSpec spec;
  for (uint32_t t = 0; t < g.tensors; ++t) {
    spec.tensors.push_back({c.device.addr() + t * s.blocks_in_device * g.segment,
                            s.blocks_in_device, g.segment, g.segment});
  }
  KvGroupLayout group;
  for (uint32_t t = 0; t < g.tensors; ++t) group.refs.push_back({t, g.segment});
  spec.groups.push_back(group);
  KVO_ASSIGN_OR_RETURN(KvLayout layout, KvLayout::Create(spec));
  s.layout = std::make_unique<KvLayout>(std::move(layout));
  KVO_ASSIGN_OR_RETURN(s.region, s.layout->MakeHostRegion(
                                     reinterpret_cast<uintptr_t>(c.host.data()), c.host.bytes()));
  if (s.blocks_in_device < 2 * job_blocks || s.region.num_slots < 2 * job_blocks) {
    return Status::Internal("bench buffers too small for two jobs");
  }
  TransferEngineOptions options;
  options.copy_method = method;
  options.compute_stream = compute;
  KVO_ASSIGN_OR_RETURN(s.engine, cuda::MakeCudaTransferEngine(options, tuning));
  KVO_RETURN_IF_ERROR(s.engine->RegisterLayout(*s.layout, s.region));
  std::vector<int64_t> blocks(s.blocks_in_device), slots(s.region.num_slots);
  std::iota(blocks.begin(), blocks.end(), 0);
  std::iota(slots.begin(), slots.end(), 0);
  std::mt19937_64 rng(c.rng());
  std::shuffle(blocks.begin(), blocks.end(), rng);
  std::shuffle(slots.begin(), slots.end(), rng);
  for (BlockTransferSpec* spec_ptr : {&s.a, &s.b}) {
    size_t off = spec_ptr == &s.a ? 0 : job_blocks;
    spec_ptr->gpu_block_ids.assign(blocks.begin() + static_cast<std::ptrdiff_t>(off),
                                   blocks.begin() + static_cast<std::ptrdiff_t>(off + job_blocks));
    spec_ptr->cpu_slots.assign(slots.begin() + static_cast<std::ptrdiff_t>(off),
                               slots.begin() + static_cast<std::ptrdiff_t>(off + job_blocks));
    spec_ptr->group_sizes = {static_cast<uint32_t>(job_blocks)};
  }
  return s;
}

uint64_t SpecBytes(const Setup& s) { return s.a.gpu_block_ids.size() * s.layout->cell_bytes(); }

// One job, submitted and waited alone; returns its TransferResult seconds.
Result<double> RunOne(TransferEngine* engine, const BlockTransferSpec& spec, TransferDirection d,
                      CopyMethod* picked = nullptr) {
  TransferRequest req;
  req.direction = d;
  req.blocks = spec;
  KVO_ASSIGN_OR_RETURN(JobId id, engine->Submit(std::move(req)));
  if (picked != nullptr) {
    KVO_ASSIGN_OR_RETURN(*picked, cuda::JobMethod(engine, id));
  }
  KVO_RETURN_IF_ERROR(engine->Wait(id));
  std::vector<TransferResult> results;
  engine->TakeFinished(&results);
  for (const auto& r : results) {
    if (!r.success) return r.status;
    if (r.job_id == id) return r.seconds;
  }
  return Status::Internal("bench: job result missing");
}

// Offloads `spec` into poisoned rows and checks them against the device fill pattern; poisons the
// device, loads `spec` back and checks the device bytes; restores the device fill.
Status Verify(Ctx& c, Setup& s, const BlockTransferSpec& spec) {
  // Earlier cases (ceilings, loads) overwrote device blocks: restore the fill pattern first.
  KVO_RETURN_IF_ERROR(
      cuda::LaunchDelayedFill(c.s1.handle(), c.device.addr(), c.device.bytes(), kFillSeed, 0));
  KVO_RETURN_IF_ERROR(c.s1.Synchronize());
  std::memset(c.host.data(), 0xA5, c.host.bytes());
  KVO_ASSIGN_OR_RETURN(double unused_s, RunOne(s.engine.get(), spec, TransferDirection::kGpuToCpu));
  (void)unused_s;
  std::vector<CopySegment> segs;
  KVO_RETURN_IF_ERROR(
      s.layout->ExpandBlockSpec(spec, s.region, TransferDirection::kGpuToCpu, false, &segs));
  for (const CopySegment& g : segs) {
    const uint8_t* host = reinterpret_cast<const uint8_t*>(g.dst);
    const uint64_t dev_off = g.src - c.device.addr();
    for (uint64_t i = 0; i < g.bytes; ++i) {
      if (host[i] != cuda::DelayedFillPattern(kFillSeed, dev_off + i)) {
        return Status::Corruption("offload: host byte " + std::to_string(i) +
                                  " of a segment differs");
      }
    }
  }
  KVO_RETURN_IF_ERROR(cuda::FillDevice(c.device.addr(), 0x5A, c.device.bytes()));
  KVO_ASSIGN_OR_RETURN(unused_s, RunOne(s.engine.get(), spec, TransferDirection::kCpuToGpu));
  std::vector<uint8_t> back(segs.empty() ? 0 : segs.front().bytes);
  for (const CopySegment& g : segs) {
    back.resize(g.bytes);
    KVO_RETURN_IF_ERROR(cuda::CopyDeviceToHost(back.data(), g.src, g.bytes));
    if (std::memcmp(back.data(), reinterpret_cast<const void*>(g.dst), g.bytes) != 0) {
      return Status::Corruption("load: device segment differs from its host row");
    }
  }
  KVO_RETURN_IF_ERROR(
      cuda::LaunchDelayedFill(c.s1.handle(), c.device.addr(), c.device.bytes(), kFillSeed, 0));
  return c.s1.Synchronize();
}

// One contiguous copy of `bytes` in direction `d` (GB/s, CUDA events).
Result<double> ContiguousOnce(Ctx& c, TransferDirection d, uint64_t bytes) {
  KVO_ASSIGN_OR_RETURN(cuda::Event e0, cuda::Event::Create());
  KVO_ASSIGN_OR_RETURN(cuda::Event e1, cuda::Event::Create());
  uintptr_t dev = c.device.addr(), host = reinterpret_cast<uintptr_t>(c.host.data());
  const bool d2h = d == TransferDirection::kGpuToCpu;
  KVO_RETURN_IF_ERROR(e0.Record(c.s1.handle()));
  KVO_RETURN_IF_ERROR(cuda::CopyAsync(c.s1.handle(), d2h ? host : dev, d2h ? dev : host, bytes));
  KVO_RETURN_IF_ERROR(e1.Record(c.s1.handle()));
  KVO_RETURN_IF_ERROR(e1.Synchronize());
  KVO_ASSIGN_OR_RETURN(double ms, e1.MillisSince(e0));
  return static_cast<double>(bytes) / (ms * 1e-3) / kGB;
}

struct Paired {
  double method_gbps = 0;
  double ceiling_gbps = 0;  // contiguous copies of the same bytes, interleaved with the jobs
};

// Each repetition runs one contiguous copy of the job's bytes and then one job, so the ratio is
// taken against a ceiling measured beside it (the link's rate drifts between machines and runs).
Result<Paired> MethodGBps(Ctx& c, Setup& s, TransferDirection d, CopyMethod* picked) {
  std::vector<double> gbps, ceil;
  const uint64_t bytes = SpecBytes(s);
  for (int i = 0; i < c.reps + 2; ++i) {
    KVO_ASSIGN_OR_RETURN(double cg, ContiguousOnce(c, d, bytes));
    KVO_ASSIGN_OR_RETURN(double sec, RunOne(s.engine.get(), s.a, d, picked));
    if (i >= 2) {
      gbps.push_back(static_cast<double>(bytes) / sec / kGB);
      ceil.push_back(cg);
    }
  }
  return Paired{Median(gbps), Median(ceil)};
}

// ---- under load ------------------------------------------------------------------------------

struct Busy {
  int ctas = 0;
  int iters = 0;
  const cuda::BusyGraph* graph = nullptr;  // set: each unit is one graph launch of its kernels
  double alone_us = 0;                     // median duration of one unit (kernel or graph) alone
};

// Launches `n` busy kernels on the compute stream with an event before and after each.
Status LaunchBusy(Ctx& c, const Busy& b, int n, std::vector<cuda::Event>* before,
                  std::vector<cuda::Event>* after) {
  for (int i = 0; i < n; ++i) {
    KVO_ASSIGN_OR_RETURN(cuda::Event e0, cuda::Event::Create());
    KVO_ASSIGN_OR_RETURN(cuda::Event e1, cuda::Event::Create());
    KVO_RETURN_IF_ERROR(e0.Record(c.compute.handle()));
    if (b.graph != nullptr) {
      KVO_RETURN_IF_ERROR(b.graph->Launch(c.compute.handle()));
    } else {
      KVO_RETURN_IF_ERROR(
          cuda::LaunchBusyKernel(c.compute.handle(), c.sink.addr(), b.ctas, b.iters));
    }
    KVO_RETURN_IF_ERROR(e1.Record(c.compute.handle()));
    before->push_back(std::move(e0));
    after->push_back(std::move(e1));
  }
  return Status::Ok();
}

Result<Busy> CalibrateBusy(Ctx& c) {
  Busy b;
  b.ctas = c.sms * 8;  // 8 x 256 threads: 2048 resident threads per SM
  b.iters = 2048;
  std::vector<cuda::Event> before, after;
  KVO_RETURN_IF_ERROR(LaunchBusy(c, b, 5, &before, &after));
  KVO_RETURN_IF_ERROR(c.compute.Synchronize());
  KVO_ASSIGN_OR_RETURN(double ms, after.back().MillisSince(before.back()));
  b.iters = std::max(64, static_cast<int>(b.iters * (0.1 / ms)));  // ~100 us per kernel
  before.clear();
  after.clear();
  KVO_RETURN_IF_ERROR(LaunchBusy(c, b, 200, &before, &after));
  KVO_RETURN_IF_ERROR(c.compute.Synchronize());
  std::vector<double> us;
  for (size_t i = 10; i < after.size(); ++i) {
    KVO_ASSIGN_OR_RETURN(double m, after[i].MillisSince(before[i]));
    us.push_back(m * 1e3);
  }
  b.alone_us = Median(us);
  return b;
}

struct LoadedResult {
  double copy_gbps = 0;
  double slowdown = 0;  // mean overlapped kernel duration / alone - 1
  double coverage = 0;  // fraction of the copy window with compute kernels running
  CopyMethod picked = CopyMethod::kAuto;
};

Result<LoadedResult> UnderLoad(Ctx& c, Setup& s, const Busy& b, TransferDirection d,
                               double idle_seconds) {
  std::vector<double> gbps, slow, cover;
  LoadedResult out;
  const int reps = std::max(3, c.reps / 2);
  for (int rep = 0; rep < reps; ++rep) {
    std::vector<cuda::Event> before, after;
    KVO_ASSIGN_OR_RETURN(cuda::Event base, cuda::Event::Create());
    KVO_RETURN_IF_ERROR(base.Record(c.compute.handle()));
    // The job waits for the compute work queued before it (20 kernels, ~2 ms, so the queue is
    // deep when the copy starts), then runs beside the kernels launched after it.
    const int kPre = b.graph != nullptr ? 2 : 20;
    KVO_RETURN_IF_ERROR(LaunchBusy(c, b, kPre, &before, &after));
    TransferRequest req;
    req.direction = d;
    req.blocks = s.a;
    KVO_ASSIGN_OR_RETURN(JobId id, s.engine->Submit(req));
    KVO_ASSIGN_OR_RETURN(out.picked, cuda::JobMethod(s.engine.get(), id));
    const int n = static_cast<int>(3.0 * idle_seconds * 1e6 / b.alone_us) + 30;
    KVO_RETURN_IF_ERROR(LaunchBusy(c, b, std::min(n, 4000), &before, &after));
    KVO_RETURN_IF_ERROR(s.engine->Wait(id));
    KVO_RETURN_IF_ERROR(c.compute.Synchronize());
    std::vector<TransferResult> results;
    s.engine->TakeFinished(&results);
    if (results.size() != 1 || !results[0].success) {
      return Status::Internal("bench: under-load job failed");
    }
    const double job_s = results[0].seconds;
    KVO_ASSIGN_OR_RETURN(double start_ms, after[kPre - 1].MillisSince(base));
    const double end_ms = start_ms + job_s * 1e3;
    double busy_ms = 0, sum_us = 0;
    int count = 0;
    for (size_t i = kPre; i < after.size(); ++i) {
      KVO_ASSIGN_OR_RETURN(double k0, before[i].MillisSince(base));
      KVO_ASSIGN_OR_RETURN(double k1, after[i].MillisSince(base));
      if (k0 >= start_ms && k1 <= end_ms) {
        sum_us += (k1 - k0) * 1e3;
        busy_ms += k1 - k0;
        ++count;
      }
    }
    gbps.push_back(static_cast<double>(SpecBytes(s)) / job_s / kGB);
    if (count > 0) slow.push_back(sum_us / count / b.alone_us - 1.0);
    cover.push_back(busy_ms / (job_s * 1e3));
  }
  out.copy_gbps = Median(gbps);
  out.slowdown = slow.empty() ? 0 : Median(slow);
  out.coverage = Median(cover);
  return out;
}

std::string Fmt(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}

Status RunAll(Ctx& c) {
  KVO_ASSIGN_OR_RETURN(c.sms, cuda::MultiprocessorCount(0));
  c.job_bytes = c.options.quick ? (32ull << 20) : (256ull << 20);
  c.reps = c.options.quick ? 3 : 20;
  KVO_ASSIGN_OR_RETURN(c.device, cuda::DeviceBuffer::Allocate(2 * c.job_bytes + (32ull << 20)));
  KVO_ASSIGN_OR_RETURN(c.host, cuda::PinnedBuffer::Allocate(2 * c.job_bytes + (32ull << 20)));
  KVO_ASSIGN_OR_RETURN(c.s1, cuda::Stream::Create());
  KVO_ASSIGN_OR_RETURN(c.s2, cuda::Stream::Create());
  KVO_ASSIGN_OR_RETURN(c.compute, cuda::Stream::Create());
  KVO_ASSIGN_OR_RETURN(c.sink,
                       cuda::DeviceBuffer::Allocate(static_cast<uint64_t>(c.sms) * 8 * 256 * 4));
  std::memset(c.host.data(), 0x11, c.host.bytes());
  BENCH_OK(cuda::LaunchDelayedFill(c.s1.handle(), c.device.addr(), c.device.bytes(), kFillSeed, 0));
  BENCH_OK(c.s1.Synchronize());

  KVO_ASSIGN_OR_RETURN(double d2h_ceiling, ContiguousGBps(c, true));
  KVO_ASSIGN_OR_RETURN(double h2d_ceiling, ContiguousGBps(c, false));
  KVO_ASSIGN_OR_RETURN(double duplex_ceiling, DuplexGBps(c));
  const std::string mib = std::to_string(c.job_bytes >> 20) + " MiB";
  Print(c, "gpu_contiguous_d2h", "GB/s", d2h_ceiling, "PCIe Gen5 x16 payload (63.0 GB/s raw)", 63.0,
        0, "one cudaMemcpyAsync of " + mib + ", pinned: the D2H ceiling");
  Print(c, "gpu_contiguous_h2d", "GB/s", h2d_ceiling, "PCIe Gen5 x16 payload (63.0 GB/s raw)", 63.0,
        0, "one cudaMemcpyAsync of " + mib + ", pinned: the H2D ceiling");
  Print(c, "gpu_contiguous_duplex", "GB/s", duplex_ceiling, "d2h + h2d ceilings",
        d2h_ceiling + h2d_ceiling, 0, "both directions at once on two streams (host wall clock)");
  auto ceiling = [&](TransferDirection d) {
    return d == TransferDirection::kGpuToCpu ? d2h_ceiling : h2d_ceiling;
  };
  auto dname = [](TransferDirection d) {
    return d == TransferDirection::kGpuToCpu ? std::string("d2h") : std::string("h2d");
  };

  const std::vector<Geometry> geometries = {
      {8 << 10, 160}, {32 << 10, 64}, {64 << 10, 64}, {256 << 10, 32}};
  const std::vector<std::string> methods = {"dma", "batch", "kernel", "staging", "auto"};
  // Idle job seconds per (method) for the 32 KiB geometry, to size the under-load runs.
  std::vector<double> idle32(methods.size() * 2, 0.01);
  for (const Geometry& g : geometries) {
    const std::string seg = std::to_string(g.segment >> 10) + "k";
    for (const TransferDirection d : {TransferDirection::kGpuToCpu, TransferDirection::kCpuToGpu}) {
      double naive = 0;
      for (size_t m = 0; m < methods.size(); ++m) {
        KVO_ASSIGN_OR_RETURN(Setup s, MakeSetup(c, g, methods[m], 0));
        Status verified =
            d == TransferDirection::kGpuToCpu ? Verify(c, s, s.b) : Status::Ok();  // both ways
        if (!verified.ok()) {
          std::fprintf(stderr, "kvo bench transfer (gpu): %s %s %s: %s\n", seg.c_str(),
                       methods[m].c_str(), dname(d).c_str(), verified.ToString().c_str());
          return verified;
        }
        CopyMethod picked = CopyMethod::kAuto;
        KVO_ASSIGN_OR_RETURN(Paired p, MethodGBps(c, s, d, &picked));
        const double gbps = p.method_gbps;
        if (methods[m] == "dma") naive = gbps / p.ceiling_gbps;
        if (g.segment == (32 << 10)) {
          idle32[m * 2 + (d == TransferDirection::kGpuToCpu ? 0 : 1)] =
              static_cast<double>(SpecBytes(s)) / (gbps * kGB);
        }
        const bool judged = methods[m] == "auto" || methods[m] == "staging";
        std::string notes = std::to_string(s.a.gpu_block_ids.size()) + " random blocks x " +
                            std::to_string(g.tensors) + " segments of " + seg +
                            "B to/from random CPU rows; data verified; " +
                            Fmt("%.1f%% of the interleaved ceiling", 100 * gbps / p.ceiling_gbps) +
                            Fmt(", naive per-segment dma %.1f%%", 100 * naive) +
                            Fmt("; %.1f%% of the run's first ceiling", 100 * gbps / ceiling(d));
        if (methods[m] == "auto") notes += "; auto picked " + std::string(CopyMethodName(picked));
        Print(c, "gpu_scatter_" + seg + "_" + methods[m] + "_" + dname(d), "GB/s", gbps,
              "contiguous " + dname(d) + " copy of the same bytes, interleaved", p.ceiling_gbps,
              judged ? 0.95 * p.ceiling_gbps : 0, notes);
      }
    }
  }

  // Offload and load at once (32 KiB segments), against the duplex ceiling.
  for (const std::string method : {"staging", "auto", "batch"}) {
    KVO_ASSIGN_OR_RETURN(Setup s, MakeSetup(c, {32 << 10, 64}, method, 0));
    std::vector<double> gbps, wall_gbps;
    const double bytes = 2.0 * static_cast<double>(SpecBytes(s));
    KVO_ASSIGN_OR_RETURN(cuda::Event gate, cuda::Event::Create());
    for (int i = 0; i < c.reps + 2; ++i) {
      // Both jobs wait for one gate event (a 2 ms kernel) so they start together; the figure is
      // the bytes of both over the longer job (each job's own CUDA-event time).
      KVO_RETURN_IF_ERROR(cuda::LaunchDelayedFill(c.s1.handle(), c.sink.addr(), 0, 0, 2'000'000));
      KVO_RETURN_IF_ERROR(gate.Record(c.s1.handle()));
      auto t0 = std::chrono::steady_clock::now();
      TransferRequest st, ld;
      st.direction = TransferDirection::kGpuToCpu;
      st.blocks = s.a;
      st.wait_event = gate.handle();
      ld.direction = TransferDirection::kCpuToGpu;
      ld.blocks = s.b;
      ld.wait_event = gate.handle();
      KVO_ASSIGN_OR_RETURN(JobId a, s.engine->Submit(st));
      KVO_ASSIGN_OR_RETURN(JobId b, s.engine->Submit(ld));
      KVO_RETURN_IF_ERROR(s.engine->Wait(a));
      KVO_RETURN_IF_ERROR(s.engine->Wait(b));
      double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::vector<TransferResult> results;
      s.engine->TakeFinished(&results);
      double longest = 0;
      for (const auto& r : results) {
        if (!r.success) return r.status;
        longest = std::max(longest, r.seconds);
      }
      if (i >= 2 && longest > 0) {
        gbps.push_back(bytes / longest / kGB);
        wall_gbps.push_back(bytes / std::max(wall - 2e-3, 1e-9) / kGB);
      }
    }
    double v = Median(gbps);
    Print(c, "gpu_duplex_32k_" + method, "GB/s", v, "contiguous duplex ceiling", duplex_ceiling,
          method == "batch" ? 0 : 0.85 * duplex_ceiling,
          "offload and load of " + mib + " each at once, 32 KiB segments, started by one gate " +
              "event; " + Fmt("%.1f%% of duplex ceiling", 100 * v / duplex_ceiling) +
              Fmt("; host wall clock less the 2 ms gate: %.1f GB/s", Median(wall_gbps)));
  }

  // Under load: busy kernels back to back on the engine's compute stream.
  KVO_ASSIGN_OR_RETURN(Busy busy, CalibrateBusy(c));
  Print(c, "gpu_busy_kernel", "us", busy.alone_us, "target ~100 us", 100, 0,
        std::to_string(busy.ctas) + " CTAs x 256 threads (full occupancy), " +
            std::to_string(busy.iters) + " FMA iterations; the forward-pass stand-in alone");
  // methods plus "staging_8cta": staging keeping its idle shape (8 long-lived 512-thread CTAs,
  // 64 KiB pieces) beside compute, to show what the busy shape (many short CTAs) buys.
  std::vector<std::string> loaded_methods = methods;
  loaded_methods.push_back("staging_8cta");
  for (size_t m = 0; m < loaded_methods.size(); ++m) {
    for (const TransferDirection d : {TransferDirection::kGpuToCpu, TransferDirection::kCpuToGpu}) {
      cuda::CudaEngineTuning tuning;
      std::string method = loaded_methods[m];
      if (method == "staging_8cta") {
        method = "staging";
        tuning.staging_busy = tuning.staging_idle;  // the idle shape beside compute too
      }
      KVO_ASSIGN_OR_RETURN(Setup s,
                           MakeSetup(c, {32 << 10, 64}, method, c.compute.handle(), tuning));
      const size_t idle_index = std::min(m, methods.size() - 2);  // staging_8cta: as staging
      double idle_s = idle32[idle_index * 2 + (d == TransferDirection::kGpuToCpu ? 0 : 1)];
      KVO_ASSIGN_OR_RETURN(LoadedResult r, UnderLoad(c, s, busy, d, idle_s));
      const bool judged = loaded_methods[m] == "auto";
      std::string name = "gpu_under_load_32k_" + loaded_methods[m] + "_" + dname(d);
      std::string notes = Fmt("copy %.1f%% of ceiling", 100 * r.copy_gbps / ceiling(d)) +
                          Fmt(", compute slowed %.2f%%", 100 * r.slowdown) +
                          Fmt(", compute covered %.0f%% of the copy", 100 * r.coverage);
      if (loaded_methods[m] == "auto") {
        notes += "; auto picked " + std::string(CopyMethodName(r.picked));
      }
      Print(c, name, "GB/s", r.copy_gbps, "contiguous " + dname(d) + " ceiling (idle)", ceiling(d),
            judged ? 0.85 * ceiling(d) : 0, notes);
      Print(c, name + "_compute", "x alone", 1.0 / (1.0 + r.slowdown), "compute alone", 1.0,
            judged ? 0.98 : 0,
            Fmt("busy kernel %.1f us alone", busy.alone_us) +
                Fmt(", %.1f us beside the copy", busy.alone_us * (1 + r.slowdown)));
    }
  }
  // The same ~100 us kernels launched as CUDA graphs of 10 (as vLLM launches decode steps): the
  // unit timed is one graph; separates a per-launch cost (command fetch over the host link) from
  // the copies' use of the SMs and memory.
  {
    KVO_ASSIGN_OR_RETURN(
        cuda::BusyGraph graph,
        cuda::BusyGraph::Capture(c.compute.handle(), c.sink.addr(), busy.ctas, busy.iters, 10));
    Busy gb = busy;
    gb.graph = &graph;
    std::vector<cuda::Event> before, after;
    KVO_RETURN_IF_ERROR(LaunchBusy(c, gb, 30, &before, &after));
    KVO_RETURN_IF_ERROR(c.compute.Synchronize());
    std::vector<double> us;
    for (size_t i = 5; i < after.size(); ++i) {
      KVO_ASSIGN_OR_RETURN(double ms, after[i].MillisSince(before[i]));
      us.push_back(ms * 1e3);
    }
    gb.alone_us = Median(us);
    for (const std::string method : {"auto", "batch"}) {
      for (const TransferDirection d :
           {TransferDirection::kGpuToCpu, TransferDirection::kCpuToGpu}) {
        KVO_ASSIGN_OR_RETURN(Setup s, MakeSetup(c, {32 << 10, 64}, method, c.compute.handle()));
        const size_t mi = method == "auto" ? 4 : 1;
        double idle_s = idle32[mi * 2 + (d == TransferDirection::kGpuToCpu ? 0 : 1)];
        KVO_ASSIGN_OR_RETURN(LoadedResult r, UnderLoad(c, s, gb, d, idle_s));
        std::string notes = Fmt("graph of 10 busy kernels: %.0f us alone", gb.alone_us) +
                            Fmt("; copy %.1f%% of ceiling", 100 * r.copy_gbps / ceiling(d)) +
                            Fmt(", compute covered %.0f%% of the copy", 100 * r.coverage);
        if (method == "auto") notes += "; auto picked " + std::string(CopyMethodName(r.picked));
        const std::string name = "gpu_under_load_graph_32k_" + method + "_" + dname(d);
        Print(c, name, "GB/s", r.copy_gbps, "contiguous " + dname(d) + " ceiling (idle)",
              ceiling(d), method == "auto" ? 0.85 * ceiling(d) : 0, notes);
        Print(c, name + "_compute", "x alone", 1.0 / (1.0 + r.slowdown), "compute alone", 1.0,
              method == "auto" ? 0.98 : 0, notes);
      }
    }
  }

  // The same for auto beside ten-times longer compute kernels (~1 ms): separates a per-launch
  // cost of the copies from a per-byte one.
  Busy long_busy = busy;
  long_busy.iters = busy.iters * 10;
  {
    std::vector<cuda::Event> before, after;
    KVO_RETURN_IF_ERROR(LaunchBusy(c, long_busy, 12, &before, &after));
    KVO_RETURN_IF_ERROR(c.compute.Synchronize());
    std::vector<double> us;
    for (size_t i = 2; i < after.size(); ++i) {
      KVO_ASSIGN_OR_RETURN(double ms, after[i].MillisSince(before[i]));
      us.push_back(ms * 1e3);
    }
    long_busy.alone_us = Median(us);
  }
  for (const TransferDirection d : {TransferDirection::kGpuToCpu, TransferDirection::kCpuToGpu}) {
    KVO_ASSIGN_OR_RETURN(Setup s, MakeSetup(c, {32 << 10, 64}, "auto", c.compute.handle()));
    double idle_s = idle32[4 * 2 + (d == TransferDirection::kGpuToCpu ? 0 : 1)];
    KVO_ASSIGN_OR_RETURN(LoadedResult r, UnderLoad(c, s, long_busy, d, idle_s));
    Print(c, "gpu_under_load_1ms_32k_auto_" + dname(d) + "_compute", "x alone",
          1.0 / (1.0 + r.slowdown), "compute alone", 1.0, 0,
          Fmt("busy kernel %.0f us alone", long_busy.alone_us) +
              Fmt("; copy %.1f%% of ceiling", 100 * r.copy_gbps / ceiling(d)) +
              Fmt(", compute covered %.0f%% of the copy", 100 * r.coverage) + "; auto picked " +
              std::string(CopyMethodName(r.picked)));
  }
  return Status::Ok();
}

int RunCudaTransferBench(const BenchOptions& options) {
  Status device = cuda::CheckDevice(0);
  if (!device.ok()) {
    std::fprintf(stderr, "kvo bench transfer: GPU cases skipped: %s\n", device.ToString().c_str());
    return 0;
  }
  Ctx c;
  c.options = options;
  Status st = RunAll(c);
  if (!st.ok()) {
    std::fprintf(stderr, "kvo bench transfer (gpu): %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}

[[maybe_unused]] const bool kRegistered = [] {
  RegisterBenchCases("transfer", RunCudaTransferBench);
  return true;
}();

}  // namespace
}  // namespace kvo::bench
