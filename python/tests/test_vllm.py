"""kvo.vllm against the stand-in of vLLM's offloading interface (tests/standin)."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import STANDIN, make_offloading_config


def key(i, group=0):
    return i.to_bytes(8, "big") + group.to_bytes(4, "big")


def whole_spec_config(tmp_path, **extra):
    cfg = {"spec_name": "KvoOffloadingSpec", "spec_module_path": "kvo.vllm",
           "cpu_bytes_to_use": 64 * 16384, "rows_dir": str(tmp_path)}
    cfg.update(extra)
    return cfg


def test_import_kvo_does_not_import_vllm():
    code = "import sys, kvo; assert 'vllm' not in sys.modules; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "") +
                              os.pathsep + STANDIN})
    assert out.stdout.strip() == "ok", out.stderr[-2000:]


def test_whole_spec_loads_through_the_factory(vllm_standin, tmp_path):
    from vllm.v1.kv_offload import base
    from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory
    config = make_offloading_config(whole_spec_config(tmp_path))
    spec = OffloadingSpecFactory.create_spec(config)
    assert type(spec).__name__ == "KvoOffloadingSpec" and spec.config is config
    assert spec.tokens_per_block == (16,) and spec.blocks_per_chunk == 1
    assert spec.offload_prompt_only is True and spec.kv_events_config.enable_kv_cache_events
    m = spec.get_manager()
    assert isinstance(m, base.OffloadingManager)
    ctx = base.ReqContext(req_id="r1")
    assert m.on_new_request(ctx) == base.RequestOffloadingContext()
    assert m.lookup(key(1), ctx) is base.LookupResult.MISS
    out = m.prepare_store([key(1), key(2)], ctx)
    assert isinstance(out, base.PrepareStoreOutput)
    assert isinstance(out.store_spec, CPULoadStoreSpec) and list(out.store_spec.block_ids) == [0, 1]
    m.complete_store([key(1), key(2)], ctx)
    assert m.lookup(key(2), ctx) is base.LookupResult.HIT
    spec_load = m.prepare_load([key(2)], ctx)
    assert list(spec_load.block_ids) == [1]
    m.complete_load([key(2)], ctx)
    m.on_schedule_end(base.ScheduleEndContext((), ()))
    assert m.has_pending_work() is False
    ev = list(m.take_events())
    assert ev == [base.OffloadingEvent(keys=[key(1), key(2)], medium=base.Medium.CPU,
                                       removed=False)]
    m.on_request_finished(ctx)
    assert m.get_stats() is None  # the stand-in has no OffloadingConnectorStats
    m.reset_cache()
    assert m.lookup(key(1), ctx) is base.LookupResult.MISS
    m.shutdown()


@pytest.mark.parametrize("extra,match", [
    ({"cpu_bytes_to_use": None}, "cpu_bytes_to_use"),
    ({"block_size": 32, "blocks_per_chunk": 2}, "block_size"),
    ({"eviction_policy": "fifo"}, "eviction_policy"),
    ({"store_threshold": "x"}, "store_threshold"),
    ({"secondary_tiers": [{"type": "fs"}]}, "root_dir"),
])
def test_bad_configs_rejected(vllm_standin, tmp_path, extra, match):
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory
    cfg = whole_spec_config(tmp_path, **extra)
    if cfg.get("cpu_bytes_to_use") is None:
        del cfg["cpu_bytes_to_use"]
    with pytest.raises(ValueError, match=match):
        OffloadingSpecFactory.create_spec(make_offloading_config(cfg))


def test_metric_definitions(vllm_standin):
    import kvo.vllm
    d = kvo.vllm.KvoOffloadingSpec.build_metric_definitions(
        {"secondary_tiers": [{"type": "fs", "root_dir": "/x"}]})
    assert "vllm:kv_offload_tiering_chunk_queries" in d
    assert "vllm:kv_offload_tiering_block_queries" not in d
    assert d["vllm:kv_offload_tiering_chunk_hits"].labelnames == ("tier",)


def _kv_caches(base, num_blocks, page, n_tensors=2, rng=None):
    arrays = [np.zeros((num_blocks, page), dtype=np.int8) for _ in range(n_tensors)]
    if rng is not None:
        for a in arrays:
            a[:] = np.frombuffer(rng.randbytes(a.size), dtype=np.int8).reshape(a.shape)
    caches = base.CanonicalKVCaches(
        tensors=[base.CanonicalKVCacheTensor(a, page) for a in arrays],
        group_data_refs=[[base.CanonicalKVCacheRef(i, page) for i in range(n_tensors)]])
    return arrays, caches


def test_worker_host_path_round_trip(vllm_standin, tmp_path, rng):
    from vllm.v1.kv_offload import base
    from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory
    page = 8192  # two tensors: 16 KiB per block, as worker_kv_bytes_per_block says
    config = make_offloading_config(whole_spec_config(tmp_path))
    spec = OffloadingSpecFactory.create_spec(config)
    arrays, caches = _kv_caches(base, 32, page, rng=rng)
    original = [a.copy() for a in arrays]
    worker = spec.get_worker(caches)
    assert isinstance(worker, base.OffloadingWorker)
    gpu = base.GPULoadStoreSpec([3, 7, 9], group_sizes=[3], block_indices=[0])
    assert worker.submit_store(1, gpu, CPULoadStoreSpec([5, 0, 2]))
    worker.wait({1})
    done = worker.get_finished()
    assert [(r.job_id, r.success) for r in done] == [(1, True)]
    for a in arrays:
        a[:] = 0
    assert worker.submit_load(2, CPULoadStoreSpec([0, 2, 5]),
                              base.GPULoadStoreSpec([11, 12, 13], [3], [0]))
    worker.wait({2})
    assert [(r.job_id, r.success) for r in worker.get_finished()] == [(2, True)]
    for a, o in zip(arrays, original):
        assert np.array_equal(a[11], o[7]) and np.array_equal(a[12], o[9])
        assert np.array_equal(a[13], o[3])
        assert not a[3].any()
    # A spec out of range is refused at submit (the connector asserts), never a fake success.
    assert not worker.submit_store(3, base.GPULoadStoreSpec([99], [1], [0]),
                                   CPULoadStoreSpec([0]))
    worker.shutdown()


def test_worker_rejects_bad_tensors(vllm_standin, tmp_path):
    from vllm.v1.kv_offload import base
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory
    spec = OffloadingSpecFactory.create_spec(make_offloading_config(whole_spec_config(tmp_path)))
    caches = base.CanonicalKVCaches(
        tensors=[base.CanonicalKVCacheTensor(bytearray(100), 100)],
        group_data_refs=[[base.CanonicalKVCacheRef(0, 100)]])
    with pytest.raises(ValueError):
        spec.get_worker(caches)


def test_older_vllm_is_named(tmp_path):
    """A vLLM with the pre-#45053 interface (get_handlers, no OffloadingWorker) fails at import
    with the interface named, not deep inside vLLM."""
    old = tmp_path / "old"
    shutil.copytree(STANDIN, old)
    base_py = old / "vllm" / "v1" / "kv_offload" / "base.py"
    text = base_py.read_text().replace("OffloadingWorker", "_Gone")
    base_py.write_text(text)
    (old / "vllm" / "__init__.py").write_text('__version__ = "0.23.1"\n')
    code = "import kvo.vllm"
    env = {**os.environ, "PYTHONPATH": str(old) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode != 0
    assert "0.23.1" in out.stderr and "kvo.vllm matches vLLM main as of 2026-08" in out.stderr


def _readme_configs():
    readme = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")
    text = open(readme).read()
    import re
    return [json.loads(m.group(1).replace("\n", " "))
            for m in re.finditer(r"--kv-transfer-config '(.*?)'", text, re.S)]


def test_readme_configs_load_through_the_factory(vllm_standin, tmp_path):
    """Both --kv-transfer-config forms the README shows load through vLLM's factory path."""
    from vllm.v1.kv_offload import base
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory
    configs = _readme_configs()
    assert len(configs) == 2
    kinds = []
    for i, cfg in enumerate(configs):
        assert cfg["kv_connector"] == "OffloadingConnector"
        extra = dict(cfg["kv_connector_extra_config"])
        extra["cpu_bytes_to_use"] = 16 * 16384  # the README's 64 GB, scaled down
        extra["rows_dir"] = str(tmp_path)
        if "journal_dir" in extra:
            extra["journal_dir"] = str(tmp_path / f"journal{i}")
        for t in extra.get("secondary_tiers", []):
            t["root_dir"] = str(tmp_path / f"fs{i}")
            if "max_bytes" in t:  # the README's 1 TB, scaled down as cpu_bytes_to_use is (1 TB
                t["max_bytes"] = 64 * 16384  # of 16 KiB rows is past the LRU index's 2^25 blocks)
        spec = OffloadingSpecFactory.create_spec(
            make_offloading_config(extra, engine_id=f"readme-{i}"))
        kinds.append(type(spec).__name__)
        if type(spec).__name__ == "KvoOffloadingSpec":
            m = spec.get_manager()
            ctx = base.ReqContext(req_id="r")
            assert m.lookup(key(1), ctx) in (base.LookupResult.MISS, base.LookupResult.RETRY)
            m.shutdown()
        else:
            assert [type(t).__name__ for t in spec.secondary_tiers] == ["KvoFsTier"]
            spec.secondary_tiers[0].shutdown()
    assert kinds == ["KvoOffloadingSpec", "TieringOffloadingSpec"]
