"""Issue 15, step 1: kvo.vllm.KvoWorker on real CUDA KV tensors.

Canonical KV tensors as vLLM hands them to get_worker: one int8 (num_blocks, page_size_bytes)
tensor per attention layer pair, shared by two KV groups (vLLM's hybrid allocation: a tensor is
shared by one layer of each group; each group has its own block ids), 16-token blocks, random
contents. Jobs are driven as vLLM's connector does (submit_store / submit_load with a
GPULoadStoreSpec + CPULoadStoreSpec, get_finished polled; wait for timing). Every block is
byte-compared after GPU->CPU->GPU and GPU->CPU->fs->CPU->GPU round trips.

Bandwidth per direction, against in the same run (a) the contiguous pinned copy ceiling (one
copy of the same byte count between a device buffer and a pinned host buffer) and (b) the torch
path of vLLM's own CPU offloading worker (index the KV tensor, copy to pinned memory
non_blocking; back: copy to the device non_blocking, index_copy_ into the KV tensor).
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kvo_gpu  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

GiB = 1 << 30


def timed(fn, reps, warmup=1):
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return out


def split(ids, groups):
    per = len(ids) // groups
    return [ids[g * per:(g + 1) * per] for g in range(groups)]


def flat(gs):
    return [b for g in gs for b in g]


def check_equal(tensors, dst, src):
    d = torch.tensor(dst, device="cuda")
    s = torch.tensor(src, device="cuda")
    bad = 0
    for t in tensors:
        eq = (t.index_select(0, d) == t.index_select(0, s)).all(dim=1)
        bad += int((~eq).sum())
    return bad  # number of (tensor, block) pairs that differ


def run_config(page_kib, a, jid, fs_root):
    dev = torch.device("cuda")
    page = page_kib * 1024
    T = a.layers // a.groups          # tensors, each shared by `groups` layers
    block_bytes = T * page            # one group block across all its layers = one CPU row
    n = max(2 * a.groups, (a.job_mib << 20) // block_bytes)
    n -= n % a.groups
    num_blocks = 2 * n + 64
    g = torch.Generator(device="cuda").manual_seed(1000 + page_kib)
    tensors = [torch.randint(-128, 128, (num_blocks, page), dtype=torch.int8, device=dev,
                             generator=g) for _ in range(T)]
    names = [[f"model.layers.{2 * i + gi}.self_attn" for i in range(T)] for gi in range(a.groups)]
    rdir = kvo_gpu.rows_dir(n * block_bytes)
    spec = kvo_gpu.make_spec({"cpu_bytes_to_use": n * block_bytes, "rows_dir": rdir},
                             worker_kv_bytes_per_block=block_bytes,
                             groups=[(16, nm) for nm in names], engine_id=f"bench-{page_kib}k")
    assert spec.num_cpu_blocks >= n, (spec.num_cpu_blocks, n)
    worker = spec.get_worker(kvo_gpu.canonical_caches(tensors, [list(range(T))] * a.groups))
    perm = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(page_kib)).tolist()
    A, B, C = perm[:n], perm[n:2 * n], perm[2 * n:2 * n + 64]
    slots = list(range(n))
    rec = dict(page_kib=page_kib, layers=a.layers, groups=a.groups, tensors=T,
               block_bytes=block_bytes, blocks_per_job=n, job_bytes=n * block_bytes,
               segments_per_job=n * T, segment_bytes=page, rows_dir=rdir,
               row_stride=worker._engine.row_stride)

    # -- correctness: a tiny job (auto picks the zero-copy kernel) and the whole job (staging)
    bad = 0
    tiny = a.groups  # one block per group: a job of <= 256 KiB at small pages (kernel method)
    for t in tensors:
        t[C[:tiny]] = 0x5A
    r = kvo_gpu.drive(worker, True, next(jid), split(A[:tiny], a.groups), slots[:tiny])
    assert r.success
    r = kvo_gpu.drive(worker, False, next(jid), split(C[:tiny], a.groups), slots[:tiny])
    assert r.success
    bad += check_equal(tensors, C[:tiny], A[:tiny])
    r = kvo_gpu.drive(worker, True, next(jid), split(A, a.groups), slots)
    assert r.success and r.transfer_size == n * block_bytes, (r.success, r.transfer_size)
    for t in tensors:
        t[B] = 0x5A
    r = kvo_gpu.drive(worker, False, next(jid), split(B, a.groups), slots)
    assert r.success
    bad += check_equal(tensors, B, A)
    rec["gpu_cpu_gpu_blocks_compared"] = (tiny + n) * T
    rec["gpu_cpu_gpu_mismatches"] = bad

    # -- GPU -> CPU -> fs -> CPU -> GPU: kvo's file tier over the same CPU rows
    m = min(n, a.fs_blocks)
    m -= m % a.groups
    root = tempfile.mkdtemp(prefix=f"fs{page_kib}k-", dir=fs_root)
    tier = kvo_gpu.make_fs_tier(spec, root)
    src = split(A[:m], a.groups)  # blocks of each group; keys carry the group index
    srcf = flat(src)
    keys = [kvo_gpu.fs_key(i, gi) for gi, gs in enumerate(src) for i in range(len(gs))]
    r = kvo_gpu.drive(worker, True, next(jid), src, slots[:m])
    assert r.success
    kvo_gpu.fs_round(tier, next(jid), keys, slots[:m], promotion=False)
    rows = np.frombuffer(spec._cpu_rows(), dtype=np.uint8)
    rows[: n * worker._engine.row_stride] = 0           # every CPU row gone
    del rows
    back = list(reversed(slots[:m]))                    # promoted into other rows
    kvo_gpu.fs_round(tier, next(jid), keys, back, promotion=True)
    dst = split(B[:m], a.groups)
    for t in tensors:
        t[flat(dst)] = 0x5A
    r = kvo_gpu.drive(worker, False, next(jid), dst, back)
    assert r.success
    fbad = check_equal(tensors, flat(dst), srcf)
    tier.shutdown()
    rec["fs_files_bytes"] = sum(os.path.getsize(os.path.join(d, f))
                                for d, _, fs in os.walk(root) for f in fs)
    shutil.rmtree(root, ignore_errors=True)
    rec["gpu_cpu_fs_cpu_gpu_blocks_compared"] = m * T
    rec["gpu_cpu_fs_cpu_gpu_mismatches"] = fbad

    # -- bandwidth: kvo worker (wall: submit .. wait; engine: its CUDA-event time)
    eng = {"store": [], "load": []}

    def kvo_job(store, dst_blocks):
        def f():
            j = next(jid)
            from vllm.v1.kv_offload import base
            from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec
            gs = split(dst_blocks, a.groups)
            gpu = base.GPULoadStoreSpec(dst_blocks, [len(x) for x in gs], [0] * a.groups)
            cpu = CPULoadStoreSpec(slots)
            ok = worker.submit_store(j, gpu, cpu) if store else worker.submit_load(j, cpu, gpu)
            assert ok
            worker.wait({j})
            res = [x for x in worker.get_finished() if x.job_id == j]
            assert res and res[0].success
            eng["store" if store else "load"].append(res[0].transfer_time)
        return f

    nbytes = n * block_bytes
    kst = timed(kvo_job(True, A), a.reps)
    eng["store"] = eng["store"][-a.reps:]
    kld = timed(kvo_job(False, B), a.reps)
    eng["load"] = eng["load"][-a.reps:]
    bad_after = check_equal(tensors, B, A)

    # -- where the wall time goes: the submit call alone (adapter: KvoWorker.submit_*, with the
    # spec conversion; engine: the extension's submit with ready lists), GPU idle before it
    sub = {"adapter_store": [], "adapter_load": [], "engine_store": [], "engine_load": []}
    from vllm.v1.kv_offload import base as vbase
    from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec as CPUSpec
    for _ in range(a.reps):
        for store, blocks in ((True, A), (False, B)):
            gs = split(blocks, a.groups)
            gpu = vbase.GPULoadStoreSpec(blocks, [len(x) for x in gs], [0] * a.groups)
            cpu = CPUSpec(slots)
            torch.cuda.synchronize()
            j = next(jid)
            t0 = time.perf_counter()
            ok = worker.submit_store(j, gpu, cpu) if store else worker.submit_load(j, cpu, gpu)
            sub["adapter_store" if store else "adapter_load"].append(time.perf_counter() - t0)
            assert ok
            worker.wait({j})
            worker.get_finished()
            sizes = [len(x) for x in gs]
            t0 = time.perf_counter()
            eid = worker._engine.submit(store, blocks, sizes, [0] * a.groups, slots)
            sub["engine_store" if store else "engine_load"].append(time.perf_counter() - t0)
            worker._engine.wait(eid)
            worker._engine.get_finished()

    # -- pipelined: the same bytes as 8 jobs submitted back to back (vLLM keeps several jobs in
    # flight; one job's submit overlaps the previous job's copy), then wait for all
    k = 8 if n >= 8 * a.groups else 1

    def pipelined(store, blocks):
        def f():
            ids = []
            per = len(blocks) // k
            per -= per % a.groups
            from vllm.v1.kv_offload import base
            from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec
            for c in range(k):
                bl = blocks[c * per:(c + 1) * per]
                gs = split(bl, a.groups)
                gpu = base.GPULoadStoreSpec(bl, [len(x) for x in gs], [0] * a.groups)
                cpu = CPULoadStoreSpec(slots[c * per:(c + 1) * per])
                j = next(jid)
                ok = (worker.submit_store(j, gpu, cpu) if store
                      else worker.submit_load(j, cpu, gpu))
                assert ok
                ids.append(j)
            worker.wait(set(ids))
            res = worker.get_finished()
            assert len(res) == k and all(x.success for x in res), res
        return f

    pst = timed(pipelined(True, A), a.reps)
    pld = timed(pipelined(False, B), a.reps)
    pbytes = (len(A) // k - (len(A) // k) % a.groups) * k * block_bytes
    bad_after += check_equal(tensors, B, A)

    # -- (b) torch path (vLLM's own CPU worker, torch version)
    host = [torch.empty((n, page), dtype=torch.int8, pin_memory=True) for _ in range(T)]
    ia = torch.tensor(A, device=dev)
    ib = torch.tensor(B, device=dev)

    def torch_store():
        for t, h in zip(tensors, host):
            h.copy_(t[ia], non_blocking=True)

    def torch_load():
        for t, h in zip(tensors, host):
            t.index_copy_(0, ib, h.to(dev, non_blocking=True))

    tst = timed(torch_store, a.reps)
    for t in tensors:
        t[B] = 0x5A
    tld = timed(torch_load, a.reps)
    torch_bad = check_equal(tensors, B, A)
    del host

    # -- (a) contiguous pinned copy ceiling, same byte count
    dbuf = torch.randint(-128, 128, (nbytes,), dtype=torch.int8, device=dev)
    hbuf = torch.empty((nbytes,), dtype=torch.int8, pin_memory=True)
    cd2h = timed(lambda: hbuf.copy_(dbuf, non_blocking=True), a.reps)
    ch2d = timed(lambda: dbuf.copy_(hbuf, non_blocking=True), a.reps)
    del dbuf, hbuf

    def gbps(ts):
        return nbytes / statistics.median(ts) / 1e9

    rec.update(
        kvo_store_GBps=gbps(kst), kvo_load_GBps=gbps(kld),
        kvo_store_engine_GBps=gbps(eng["store"]), kvo_load_engine_GBps=gbps(eng["load"]),
        torch_store_GBps=gbps(tst), torch_load_GBps=gbps(tld),
        ceiling_d2h_GBps=gbps(cd2h), ceiling_h2d_GBps=gbps(ch2d),
        kvo_pipelined_jobs=k, kvo_pipelined_store_GBps=pbytes / statistics.median(pst) / 1e9,
        kvo_pipelined_load_GBps=pbytes / statistics.median(pld) / 1e9,
        submit_ms={k2: 1e3 * statistics.median(v) for k2, v in sub.items()},
        reps=a.reps, timed_mismatches=bad_after, torch_path_mismatches=torch_bad,
        raw_s=dict(kvo_store=kst, kvo_load=kld, kvo_store_engine=eng["store"],
                   kvo_load_engine=eng["load"], torch_store=tst, torch_load=tld,
                   ceiling_d2h=cd2h, ceiling_h2d=ch2d, pipelined_store=pst,
                   pipelined_load=pld, submit=sub))
    rec["store_vs_ceiling"] = rec["kvo_store_GBps"] / rec["ceiling_d2h_GBps"]
    rec["load_vs_ceiling"] = rec["kvo_load_GBps"] / rec["ceiling_h2d_GBps"]
    rec["store_vs_torch"] = rec["kvo_store_GBps"] / rec["torch_store_GBps"]
    rec["load_vs_torch"] = rec["kvo_load_GBps"] / rec["torch_load_GBps"]
    worker.shutdown()
    del worker, tensors
    path = kvo_gpu.rows_file(spec)
    try:
        spec._rows.close()
    except BufferError:  # the engine still holds a view of it; unlinking is enough
        pass
    spec._rows = None
    try:
        os.remove(path)
    except OSError:
        pass
    torch.cuda.empty_cache()
    return rec


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--pages", default="8,16,32,64,128,256", help="KiB per layer per block")
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--groups", type=int, default=2)
    p.add_argument("--job-mib", type=int, default=512)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--fs-blocks", type=int, default=64)
    p.add_argument("--fs-root", default=None)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    import itertools
    jid = itertools.count(1)
    import kvo
    info = dict(device=torch.cuda.get_device_name(0), torch=torch.__version__,
                engines=list(kvo.transfer_engines()), python=sys.version.split()[0],
                date=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), args=vars(a))
    print(json.dumps(info), flush=True)
    assert "cuda" in info["engines"], "kvo built without the CUDA engine"
    out = dict(info=info, configs=[])
    failed = False
    for pk in [int(x) for x in a.pages.split(",")]:
        try:
            rec = run_config(pk, a, jid, a.fs_root)
        except Exception as e:  # keep the other sizes
            import traceback
            traceback.print_exc()
            rec = dict(page_kib=pk, error=repr(e))
            failed = True
        out["configs"].append(rec)
        print(json.dumps({k: v for k, v in rec.items() if k != "raw_s"}), flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(out, f, indent=1)
    print(f"{'KiB':>4} {'segs':>6} {'MiB':>5} | {'kvo D2H':>7} {'ceil':>6} {'torch':>6} "
          f"{'%ceil':>5} {'xtorch':>6} | {'kvo H2D':>7} {'ceil':>6} {'torch':>6} {'%ceil':>5} "
          f"{'xtorch':>6} | mism")
    for r in out["configs"]:
        if "error" in r:
            print(f"{r['page_kib']:>4} ERROR {r['error'][:100]}")
            continue
        mism = (r["gpu_cpu_gpu_mismatches"] + r["gpu_cpu_fs_cpu_gpu_mismatches"]
                + r["timed_mismatches"])
        print(f"{r['page_kib']:>4} {r['segments_per_job']:>6} {r['job_bytes'] >> 20:>5} | "
              f"{r['kvo_store_GBps']:7.1f} {r['ceiling_d2h_GBps']:6.1f} "
              f"{r['torch_store_GBps']:6.1f} {100 * r['store_vs_ceiling']:5.1f} "
              f"{r['store_vs_torch']:6.2f} | {r['kvo_load_GBps']:7.1f} "
              f"{r['ceiling_h2d_GBps']:6.1f} {r['torch_load_GBps']:6.1f} "
              f"{100 * r['load_vs_ceiling']:5.1f} {r['load_vs_torch']:6.2f} | {mism}")
    print(f"{'KiB':>4} | engine-time D2H H2D GB/s | pipelined x8 D2H H2D GB/s (%ceil) | "
          "submit ms: adapter st/ld, engine st/ld")
    for r in out["configs"]:
        if "error" in r:
            continue
        sm = r["submit_ms"]
        print(f"{r['page_kib']:>4} | {r['kvo_store_engine_GBps']:6.1f} {r['kvo_load_engine_GBps']:6.1f}"
              f" | {r['kvo_pipelined_store_GBps']:6.1f} {r['kvo_pipelined_load_GBps']:6.1f} "
              f"({100 * r['kvo_pipelined_store_GBps'] / r['ceiling_d2h_GBps']:.1f} / "
              f"{100 * r['kvo_pipelined_load_GBps'] / r['ceiling_h2d_GBps']:.1f} %) | "
              f"{sm['adapter_store']:.2f} {sm['adapter_load']:.2f} {sm['engine_store']:.2f} "
              f"{sm['engine_load']:.2f}")
    ok = not failed and all(
        r["gpu_cpu_gpu_mismatches"] == 0 and r["gpu_cpu_fs_cpu_gpu_mismatches"] == 0
        and r["timed_mismatches"] == 0 for r in out["configs"])
    print("WORKER_BENCH", "OK" if ok else "FAILED", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
