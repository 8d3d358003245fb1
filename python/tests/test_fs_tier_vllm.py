"""KvoFsTier held to what vLLM's own file tier (FileSystemTierManager) does, as vLLM's tier tests
build it: a spec whose extra_config is empty (the geometry comes from the primary view), a
(num_blocks, row) numpy view of real memory, real directories and real files. Each test names the
behaviour of vLLM's tier it checks (python/README.md, "Checked against vLLM itself")."""
import os
import types

import numpy as np
import pytest

ROW = 16384  # bytes per row (a page multiple, so O_DIRECT may be used)
NUM_ROWS = 8


def key(i):
    return i.to_bytes(8, "big") + (0).to_bytes(4, "big")


def spec(events=False, *, tp=1, rank=0, replicated=False):
    """As vLLM's tests build it: extra_config empty, worker_kv_bytes_per_block 0."""
    from vllm.v1.kv_offload.base import OffloadingKVEventsConfig
    from vllm.v1.kv_offload.config import (OffloadingCacheConfig, OffloadingConfig,
                                           OffloadingModelConfig, OffloadingParallelConfig)
    cfg = OffloadingConfig(
        groups=(), worker_kv_bytes_per_block=0, enable_kv_cache_events=events, extra_config={},
        engine_id="e", model=OffloadingModelConfig("test-model", "float32"),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=rank, world_size=tp, tp_size=tp, pp_size=1, pcp_size=1, dcp_size=1,
            data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
            is_parallelism_agnostic=False),
        replicated_layout=replicated)
    return types.SimpleNamespace(
        config=cfg, extra_config={}, blocks_per_chunk=1,
        kv_events_config=OffloadingKVEventsConfig(events, False))


def rows(n=NUM_ROWS):
    """(n, ROW/4) float32 in page-aligned memory, as vLLM's tests hand the tier (itemsize 4)."""
    import mmap
    buf = mmap.mmap(-1, n * ROW)
    return np.frombuffer(buf, dtype=np.float32).reshape(n, ROW // 4)


def make(root, sp=None, view=None, **kw):
    import kvo.vllm
    view = rows() if view is None else view
    t = kvo.vllm.KvoFsTier(sp or spec(), memoryview(view), "fs", root_dir=str(root),
                           n_read_threads=2, n_write_threads=2, **kw)
    return t, view


def job(job_id, keys, slots, promotion=False, req="r"):
    from vllm.v1.kv_offload.base import ReqContext
    from vllm.v1.kv_offload.tiering.base import TransferJob
    return TransferJob(job_id=job_id, keys=keys, block_ids=np.array(slots, dtype=np.int64),
                       is_promotion=promotion, req_context=ReqContext(req_id=req))


def run(tier, submit, j):
    submit(j)
    tier.drain_jobs()
    return list(tier.get_finished_jobs())


def verdicts(tier, keys, req):
    """vLLM's asynchronous lookup: RETRY during the step, the verdict after it."""
    from vllm.v1.kv_offload.base import LookupResult, ReqContext, ScheduleEndContext
    ctx = ReqContext(req_id=req)
    first = [tier.lookup(k, ctx) for k in keys]
    if all(r is not LookupResult.RETRY for r in first):
        return [r.name for r in first]
    tier.on_schedule_end(ScheduleEndContext((), ()))
    return [tier.lookup(k, ctx).name for k in keys]


def path_of(root, k):
    import glob
    found = glob.glob(os.path.join(str(root), "**", k[:8].hex() + ".bin"), recursive=True)
    assert len(found) == 1, found
    return found[0]


def fill(view, rng, slots):
    for s in slots:
        view[s] = np.frombuffer(rng.randbytes(ROW), dtype=np.float32)


def test_geometry_from_the_primary_view(vllm_standin, tmp_path, rng):
    """vLLM: the row size is primary_kv_view.strides[0]; extra_config may be empty."""
    tier, view = make(tmp_path)
    fill(view, rng, [0, 1])
    want = view[:2].copy()
    assert [r.success for r in run(tier, tier.submit_store, job(1, [key(1), key(2)], [0, 1]))] \
        == [True]
    assert os.path.getsize(path_of(tmp_path, key(1))) == ROW
    view[:] = 0
    assert [r.success for r in run(tier, tier.submit_load,
                                   job(2, [key(1), key(2)], [6, 7], True))] == [True]
    assert view[6:8].tobytes() == want.tobytes()
    tier.shutdown()
    with pytest.raises(ValueError, match="primary_kv_view"):  # no block dimension
        make(tmp_path, view=np.zeros(NUM_ROWS * ROW, dtype=np.uint8))


@pytest.mark.parametrize("bad", [0, 2])
def test_batched_load_stops_at_its_first_bad_block(vllm_standin, tmp_path, rng, bad):
    """vLLM: a batched load stops at its first bad block: the blocks before it are the job's
    successful_keys (None when there are none), it and the later ones are MISS for the same
    request; only the bad (truncated) file is removed; a fresh request re-probes."""
    tier, view = make(tmp_path)
    keys = [key(1), key(2), key(3)]
    fill(view, rng, [0, 1, 2])
    assert run(tier, tier.submit_store, job(1, keys, [0, 1, 2]))[0].success
    assert verdicts(tier, keys, "a") == ["HIT"] * 3
    with open(path_of(tmp_path, keys[bad]), "wb") as f:
        f.write(b"x" * 10)
    (res,) = run(tier, tier.submit_load, job(2, keys, [3, 4, 5], True, req="a"))
    assert not res.success
    assert res.successful_keys == (tuple(keys[:bad]) if bad else None)
    want = ["HIT"] * bad + ["MISS"] * (3 - bad)
    assert verdicts(tier, keys, "a") == want  # cached verdicts, corrected: no re-probe
    from vllm.v1.kv_offload.base import ReqContext
    tier.on_request_finished(ReqContext(req_id="a"))
    fresh = ["HIT"] * 3
    fresh[bad] = "MISS"
    assert verdicts(tier, keys, "b") == fresh
    tier.shutdown()


def test_transient_load_error_leaves_the_file(vllm_standin, tmp_path, rng):
    """vLLM: only a proven short read removes a file; an open that fails (here ELOOP: the path is
    a symlink loop, never followed) fails the job and leaves the path as it is."""
    tier, view = make(tmp_path)
    fill(view, rng, [0])
    want = view[0].copy()
    assert run(tier, tier.submit_store, job(1, [key(1)], [0]))[0].success
    p = path_of(tmp_path, key(1))
    os.rename(p, p + ".saved")
    os.symlink(p + ".loop", p)
    os.symlink(p, p + ".loop")
    (res,) = run(tier, tier.submit_load, job(2, [key(1)], [1], True))
    assert not res.success
    assert os.path.islink(p)  # left in place
    os.unlink(p)
    os.unlink(p + ".loop")
    os.rename(p + ".saved", p)
    view[1] = 0
    assert run(tier, tier.submit_load, job(3, [key(1)], [1], True))[0].success
    assert view[1].tobytes() == want.tobytes()
    tier.shutdown()


def test_locality_and_events(vllm_standin, tmp_path):
    """vLLM: `locality` (None, "LOCAL" or "REMOTE"; else "... is not a valid Locality") is the
    tier's attribute and its stored events'; `events` is None unless both the tier's
    enable_kv_events and the global KV-events flag are on."""
    from vllm.v1.kv_offload.base import Locality, Medium
    for bad in ("local", ""):
        with pytest.raises(ValueError, match="is not a valid Locality"):
            make(tmp_path / "x", locality=bad)
    for loc, want in ((None, None), ("REMOTE", Locality.REMOTE), ("LOCAL", Locality.LOCAL)):
        kw = {} if loc is None else {"locality": loc}
        tier, _ = make(tmp_path / str(loc), spec(True), enable_kv_events=True, **kw)
        assert tier.locality is want
        assert tier.events == []
        assert run(tier, tier.submit_store, job(1, [key(1), key(2)], [0, 1]))[0].success
        assert len(tier.events) == 1  # readable before take_events, which then hands it out
        (e,) = tier.take_events()
        assert (e.keys, e.medium, e.removed, e.locality) == \
            ([key(1), key(2)], Medium.STORAGE, False, want)
        assert tier.take_events() == [] and tier.events == []
        tier.shutdown()
    for sp, on in ((spec(False), True), (spec(True), False)):  # global flag off / tier's off
        tier, _ = make(tmp_path / f"off{on}", sp, enable_kv_events=on)
        assert tier.events is None
        assert run(tier, tier.submit_store, job(1, [key(1)], [0]))[0].success
        assert tier.take_events() == []
        tier.shutdown()


def test_replicated_writer_and_reader_of_other_tp_share_blocks(vllm_standin, tmp_path, rng):
    """vLLM: with a replicated layout the tier's namespace does not depend on tp size or rank,
    so a TP=4 reader finds and loads what a TP=2 writer stored."""
    writer, wv = make(tmp_path, spec(tp=2, rank=0, replicated=True))
    fill(wv, rng, [0])
    want = wv[0].copy()
    assert run(writer, writer.submit_store, job(1, [key(7)], [0]))[0].success
    writer.shutdown()
    reader, rv = make(tmp_path, spec(tp=4, rank=3, replicated=True))
    assert verdicts(reader, [key(7)], "r") == ["HIT"]
    assert run(reader, reader.submit_load, job(2, [key(7)], [1], True))[0].success
    assert rv[1].tobytes() == want.tobytes()
    reader.shutdown()
    # Without the replicated layout, TP sizes name different namespaces (vLLM's FileMapper).
    other, _ = make(tmp_path, spec(tp=4, rank=0))
    assert verdicts(other, [key(7)], "r") == ["MISS"]
    other.shutdown()


def test_verdict_cached_after_promotion_and_empty_batches(vllm_standin, tmp_path, rng):
    """vLLM: after a successful promotion the same request's lookup answers its cached HIT (no
    new RETRY); an empty load or store batch is a success."""
    from vllm.v1.kv_offload.base import LookupResult, ReqContext
    tier, view = make(tmp_path)
    fill(view, rng, [0])
    assert run(tier, tier.submit_store, job(1, [key(1)], [0]))[0].success
    assert verdicts(tier, [key(1)], "p") == ["HIT"]
    assert run(tier, tier.submit_load, job(2, [key(1)], [1], True, req="p"))[0].success
    assert tier.lookup(key(1), ReqContext(req_id="p")) is LookupResult.HIT
    assert os.path.exists(path_of(tmp_path, key(1)))
    assert [(r.job_id, r.success) for r in run(tier, tier.submit_load, job(3, [], [], True))] \
        == [(3, True)]
    assert [(r.job_id, r.success) for r in run(tier, tier.submit_store, job(4, [], []))] \
        == [(4, True)]
    tier.shutdown()


# ---- the rank directory follows vLLM's FileMapper rule: <namespace>_r{parallel.rank}, and rank 0
# whatever the rank when the layout is parallelism-agnostic or replicated (FileMapper sets rank = 0
# then). Checked through KvoFsTier, KvoOffloadingSpec and kvo.OffloadManager.from_config, against
# the real directories.


def rank_spec(*, tp, rank, replicated=False, agnostic=False):
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
    sp = rank_spec(tp=tp, rank=rank, replicated=replicated, agnostic=agnostic)
    store_one(tmp_path, sp, key(5), 7)
    assert rank_dirs(tmp_path) == [want]
    found = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path) for f in fs
             if f.endswith(".bin")]
    assert len(found) == 1 and f"_r{want}{os.sep}" in found[0], found


def test_ranks_do_not_see_each_others_blocks(vllm_standin, tmp_path):
    """vLLM: without an agnostic layout, rank 1's files are not rank 0's (same namespace, other
    rank directory); with a replicated layout every rank shares rank 0's."""
    import kvo.vllm
    store_one(tmp_path, rank_spec(tp=2, rank=1), key(9), 3)
    assert rank_dirs(tmp_path) == ["1"]
    for rank, want in ((0, "MISS"), (1, "HIT")):
        view = np.zeros((2, ROW), dtype=np.uint8)
        t = kvo.vllm.KvoFsTier(rank_spec(tp=2, rank=rank), memoryview(view), "fs",
                               root_dir=str(tmp_path))
        try:
            assert verdicts(t, [key(9)], "q")[0] == want, rank
        finally:
            t.shutdown()
    assert rank_dirs(tmp_path) == ["0", "1"]
    store_one(tmp_path, rank_spec(tp=2, rank=1, replicated=True), key(11), 4)
    view = np.zeros((2, ROW), dtype=np.uint8)
    t = kvo.vllm.KvoFsTier(rank_spec(tp=4, rank=3, replicated=True), memoryview(view), "fs",
                           root_dir=str(tmp_path))
    try:
        assert verdicts(t, [key(11)], "q")[0] == "HIT"
    finally:
        t.shutdown()


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
