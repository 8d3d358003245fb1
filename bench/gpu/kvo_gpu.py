"""Shared set-up of the GPU runs (issue 15): the kvo package from the build tree, vLLM's
offloading interface from the stand-in (python/tests/standin; vLLM itself is not on the device),
an OffloadingConfig as vLLM's connector builds it, and the connector's drive loop."""
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
# The package's Python sources (KVO_PY_SRC: the snapshot the extension was built from, see
# run_on_device.sh) and the folder holding kvo/_kvo*.so (KVO_PY_BUILD).
PY_SRC = os.environ.get("KVO_PY_SRC", os.path.join(ROOT, "python"))
STANDIN = os.path.join(PY_SRC, "tests", "standin")


def setup_path():
    build = os.environ.get("KVO_PY_BUILD", os.path.join(ROOT, "build", "dev", "python"))
    for p in (PY_SRC, build, STANDIN):
        if p not in sys.path:
            sys.path.insert(0, p)


setup_path()


def make_config(extra, *, worker_kv_bytes_per_block, groups, engine_id, model="llama-random"):
    """groups: [(tokens_per_block, (layer names...)), ...]"""
    from vllm.v1.kv_offload.config import (OffloadingCacheConfig, OffloadingConfig,
                                           OffloadingGroupConfig, OffloadingModelConfig,
                                           OffloadingParallelConfig)
    return OffloadingConfig(
        groups=tuple(OffloadingGroupConfig(t, tuple(n)) for t, n in groups),
        worker_kv_bytes_per_block=worker_kv_bytes_per_block,
        enable_kv_cache_events=False, extra_config=extra, engine_id=engine_id,
        model=OffloadingModelConfig(model, "bfloat16"),
        cache=OffloadingCacheConfig(tokens_per_hash=groups[0][0], blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
            data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
            is_parallelism_agnostic=False))


def rows_dir(nbytes):
    """/dev/shm (vLLM's default) when it holds the rows with room to spare, else /tmp."""
    import shutil
    for d in ("/dev/shm", "/tmp"):
        try:
            if os.path.isdir(d) and shutil.disk_usage(d).free > 2 * nbytes + (256 << 20):
                return d
        except OSError:
            pass
    return "/tmp"


def make_spec(extra, **kw):
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory
    cfg = {"spec_name": "KvoOffloadingSpec", "spec_module_path": "kvo.vllm"}
    cfg.update(extra)
    return OffloadingSpecFactory.create_spec(make_config(cfg, **kw))


def rows_file(spec):
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in spec.config.engine_id)
    return os.path.join(spec.extra_config.get("rows_dir"), f"kvo-{safe}.rows")


def canonical_caches(tensors, groups_refs):
    """vLLM's CanonicalKVCaches: int8 (num_blocks, page) tensors; groups_refs: per group the
    tensor indices it uses (vLLM shares one tensor between layers of different groups)."""
    from vllm.v1.kv_offload import base
    return base.CanonicalKVCaches(
        tensors=[base.CanonicalKVCacheTensor(t, int(t.shape[1])) for t in tensors],
        group_data_refs=[[base.CanonicalKVCacheRef(i, int(tensors[i].shape[1])) for i in refs]
                         for refs in groups_refs])


def drive(worker, store, job_id, gpu_blocks_per_group, cpu_slots, timeout=60.0):
    """One job as vLLM's OffloadingConnector drives it: submit_store/submit_load with a
    GPULoadStoreSpec (block ids per group) and a CPULoadStoreSpec, then get_finished() polled
    each step until the job is reported. Returns the TransferResult."""
    from vllm.v1.kv_offload import base
    from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec
    ids = [b for g in gpu_blocks_per_group for b in g]
    gpu = base.GPULoadStoreSpec(ids, group_sizes=[len(g) for g in gpu_blocks_per_group],
                                block_indices=[0] * len(gpu_blocks_per_group))
    cpu = CPULoadStoreSpec(list(cpu_slots))
    ok = (worker.submit_store(job_id, gpu, cpu) if store
          else worker.submit_load(job_id, cpu, gpu))
    assert ok, f"job {job_id} not submitted"
    t0 = time.monotonic()
    while True:
        for r in worker.get_finished():
            if r.job_id == job_id:
                return r
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"job {job_id} not finished in {timeout} s")
        time.sleep(0.0005)


def make_fs_tier(spec, root, **kw):
    """kvo's file tier (KvoFsTier, a vLLM secondary tier) over the worker's CPU rows."""
    import kvo.vllm
    tier = {"root_dir": str(root), "n_read_threads": 4, "n_write_threads": 4}
    tier.update(kw)
    return kvo.vllm.KvoFsTier(spec, memoryview(spec._cpu_rows()), "KvoFsTier", **tier)


def fs_job(job_id, keys, slots, promotion):
    import numpy as np
    from vllm.v1.kv_offload.base import ReqContext
    from vllm.v1.kv_offload.tiering.base import TransferJob
    return TransferJob(job_id=job_id, keys=list(keys), block_ids=np.array(slots, dtype=np.int64),
                       is_promotion=promotion, req_context=ReqContext(req_id="fs"))


def fs_round(tier, job_id, keys, slots, promotion):
    (tier.submit_load if promotion else tier.submit_store)(fs_job(job_id, keys, slots, promotion))
    tier.drain_jobs()
    res = list(tier.get_finished_jobs())
    assert [(r.job_id, r.success) for r in res] == [(job_id, True)], res
    return res


def fs_key(i, group=0):
    return int(i).to_bytes(32, "big") + int(group).to_bytes(4, "big")
