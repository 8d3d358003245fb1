"""The file tier's rank directory follows vLLM's FileMapper rule: <namespace>_r{parallel.rank}, and
rank 0 whatever the rank when the layout is parallelism-agnostic or replicated (FileMapper sets
rank = 0 then). Checked through KvoFsTier (under vLLM's TieringOffloadingSpec), KvoOffloadingSpec
(kvo's whole spec) and kvo.OffloadManager.from_config, against the real directories."""
import os
import types

import numpy as np
import pytest

ROW = 16384


def key(i):
    return i.to_bytes(8, "big") + (0).to_bytes(4, "big")


def spec(*, tp, rank, replicated=False, agnostic=False):
    from vllm.v1.kv_offload.base import OffloadingKVEventsConfig
    from vllm.v1.kv_offload.config import (OffloadingCacheConfig, OffloadingConfig,
                                           OffloadingModelConfig, OffloadingParallelConfig)
    cfg = OffloadingConfig(
        groups=(), worker_kv_bytes_per_block=0, enable_kv_cache_events=False, extra_config={},
        engine_id="e", model=OffloadingModelConfig("test-model", "float32"),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=rank, world_size=tp, tp_size=tp, pp_size=1, pcp_size=1, dcp_size=1,
            data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
            is_parallelism_agnostic=agnostic),
        replicated_layout=replicated)
    return types.SimpleNamespace(config=cfg, extra_config={}, blocks_per_chunk=1,
                                 kv_events_config=OffloadingKVEventsConfig(False, False))


def rank_dirs(root):
    """The rank suffixes of the namespace directories under root ('_r<rank>')."""
    return sorted(n.rsplit("_r", 1)[1] for n in os.listdir(root)
                  if os.path.isdir(os.path.join(root, n)) and "_r" in n)


def store_one(root, sp, k, fill):
    import mmap

    import kvo.vllm
    from vllm.v1.kv_offload.base import ReqContext
    from vllm.v1.kv_offload.tiering.base import TransferJob
    view = np.frombuffer(mmap.mmap(-1, 4 * ROW), dtype=np.uint8).reshape(4, ROW)
    view[0] = fill
    t = kvo.vllm.KvoFsTier(sp, memoryview(view), "fs", root_dir=str(root), n_read_threads=1,
                           n_write_threads=1)
    t.submit_store(TransferJob(job_id=1, keys=[k], block_ids=np.array([0], dtype=np.int64),
                               is_promotion=False, req_context=ReqContext(req_id="r")))
    t.drain_jobs()
    assert [j.success for j in t.get_finished_jobs()] == [True]
    t.shutdown()


@pytest.mark.parametrize("tp,rank,replicated,agnostic,want", [
    (2, 1, False, False, "1"),   # each rank its own directory
    (4, 3, False, False, "3"),
    (4, 3, True, False, "0"),    # replicated: rank forced to 0
    (4, 2, False, True, "0"),    # parallelism-agnostic block: rank forced to 0
])
def test_fs_tier_rank_directory_is_vllms(vllm_standin, tmp_path, tp, rank, replicated, agnostic,
                                          want):
    store_one(tmp_path, spec(tp=tp, rank=rank, replicated=replicated, agnostic=agnostic), key(5),
              7)
    assert rank_dirs(tmp_path) == [want]
    found = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path) for f in fs
             if f.endswith(".bin")]
    assert len(found) == 1 and f"_r{want}{os.sep}" in found[0], found


def test_ranks_do_not_see_each_others_blocks(vllm_standin, tmp_path):
    """vLLM: without an agnostic layout, rank 1's files are not rank 0's (same namespace, other
    rank directory); with a replicated layout every rank shares rank 0's."""
    import kvo.vllm
    store_one(tmp_path, spec(tp=2, rank=1), key(9), 3)
    assert rank_dirs(tmp_path) == ["1"]
    for rank, want in ((0, "MISS"), (1, "HIT")):
        view = np.zeros((2, ROW), dtype=np.uint8)
        t = kvo.vllm.KvoFsTier(spec(tp=2, rank=rank), memoryview(view), "fs",
                               root_dir=str(tmp_path))
        try:
            assert verdict(t, key(9)) == want, rank
        finally:
            t.shutdown()
    assert rank_dirs(tmp_path) == ["0", "1"]
    store_one(tmp_path, spec(tp=2, rank=1, replicated=True), key(11), 4)
    view = np.zeros((2, ROW), dtype=np.uint8)
    t = kvo.vllm.KvoFsTier(spec(tp=4, rank=3, replicated=True), memoryview(view), "fs",
                           root_dir=str(tmp_path))
    try:
        assert verdict(t, key(11)) == "HIT"
    finally:
        t.shutdown()


def verdict(tier, k):
    """vLLM's asynchronous lookup: RETRY during the step, the verdict after it."""
    from vllm.v1.kv_offload.base import LookupResult, ReqContext, ScheduleEndContext
    ctx = ReqContext(req_id="q")
    r = tier.lookup(k, ctx)
    if r is LookupResult.RETRY:
        tier.on_schedule_end(ScheduleEndContext((), ()))
        r = tier.lookup(k, ctx)
    return r.name


def test_kvo_spec_passes_the_rank(vllm_standin, tmp_path):
    """KvoOffloadingSpec (kvo's whole spec, a fs tier under its CPU tier) in the scheduler of
    rank 1 of 2 (as a test; vLLM's scheduler runs at rank 0): the tier's directory is _r1."""
    import kvo.vllm
    from conftest import make_offloading_config
    extra = {"cpu_bytes_to_use": 8 * 16384 * 2, "rows_dir": str(tmp_path),
             "secondary_tiers": [{"type": "fs", "root_dir": str(tmp_path / "fs")}]}
    cfg = make_offloading_config(extra, world_size=2, rank=1, engine_id="rank-test")
    sp = kvo.vllm.KvoOffloadingSpec(cfg)
    m = sp.get_manager()
    try:
        assert rank_dirs(tmp_path / "fs") == ["1"]
    finally:
        m.native.shutdown()


def test_from_config_rank_argument(tmp_path):
    import kvo
    root = tmp_path / "fs"
    root.mkdir()
    extra = {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 4 * 4096,
             "secondary_tiers": [{"type": "fs", "root_dir": str(root)}]}
    kw = dict(worker_kv_bytes_per_block=4096, world_size=4, tp_size=4)
    kvo.OffloadManager.from_config(extra, rank=2, **kw).shutdown()
    kvo.OffloadManager.from_config(extra, rank=3, parallel_agnostic=True, **kw).shutdown()
    assert rank_dirs(root) == ["0", "2"]
    with pytest.raises(ValueError, match="rank"):
        kvo.OffloadManager.from_config(extra, rank=-1, **kw)
    with pytest.raises(TypeError, match="rank"):
        kvo.OffloadManager.from_config(extra, rank="1", **kw)
