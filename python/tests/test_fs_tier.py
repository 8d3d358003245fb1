"""KvoFsTier under the stand-in of vLLM's TieringOffloadingSpec: real bytearray CPU rows, real
directories, a real process restart."""
import glob
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import STANDIN, make_offloading_config

ROW = 16384  # worker_kv_bytes_per_block (a page multiple: vLLM and kvo agree on the row)
NUM_ROWS = 16


def key(i):
    return i.to_bytes(32, "big") + (0).to_bytes(4, "big")


def tier_config(root, **kw):
    t = {"type": "KvoFsTier", "module_path": "kvo.vllm", "root_dir": str(root),
         "n_read_threads": 2, "n_write_threads": 2, "enable_kv_events": True}
    t.update(kw)
    return {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": NUM_ROWS * ROW,
            "secondary_tiers": [t]}


def make_tier(root, **kw):
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory
    spec = OffloadingSpecFactory.create_spec(
        make_offloading_config(tier_config(root, **kw), worker_kv_bytes_per_block=ROW))
    assert len(spec.secondary_tiers) == 1
    return spec, spec.secondary_tiers[0]


def job(job_id, keys, slots, promotion):
    from vllm.v1.kv_offload.base import ReqContext
    from vllm.v1.kv_offload.tiering.base import TransferJob
    return TransferJob(job_id=job_id, keys=keys, block_ids=np.array(slots, dtype=np.int64),
                       is_promotion=promotion, req_context=ReqContext(req_id="r"))


def settle(tier, key_, ctx):
    """vLLM's asynchronous lookup: RETRY until the step ends, then the verdict."""
    from vllm.v1.kv_offload.base import LookupResult, ScheduleEndContext
    first = tier.lookup(key_, ctx)
    assert first in (LookupResult.RETRY, LookupResult.MISS, LookupResult.HIT)
    if first is not LookupResult.RETRY:
        return first
    tier.drain_jobs()
    tier.on_schedule_end(ScheduleEndContext((), ()))
    return tier.lookup(key_, ctx)


def test_loads_through_vllm_factory_and_ignores_new_keywords(vllm_standin, tmp_path):
    import kvo.vllm
    spec, tier = make_tier(tmp_path / "fs")
    assert isinstance(tier, kvo.vllm.KvoFsTier)  # got backpressure_detector= from the factory
    tier.shutdown()


@pytest.mark.parametrize("change,match", [
    ({"root_dir": None}, "root_dir"),
    ({"n_read_threads": "4"}, "n_read_threads"),
    ({"max_bytes": -1}, "max_bytes"),
    ({"locality": "nowhere"}, "locality"),
])
def test_bad_tier_config(vllm_standin, tmp_path, change, match):
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory
    cfg = tier_config(tmp_path)
    for k, v in change.items():
        if v is None:
            del cfg["secondary_tiers"][0][k]
        else:
            cfg["secondary_tiers"][0][k] = v
    with pytest.raises(ValueError, match=match):
        OffloadingSpecFactory.create_spec(
            make_offloading_config(cfg, worker_kv_bytes_per_block=ROW))


RESTART = textwrap.dedent("""
    import sys, json
    sys.path.insert(0, {standin!r})
    sys.path.insert(0, {tests!r})
    import numpy as np
    from test_fs_tier import make_tier, job, settle, key
    from vllm.v1.kv_offload.base import LookupResult, ReqContext
    spec, tier = make_tier({root!r})
    ctx = ReqContext(req_id="after-restart")
    verdicts = [settle(tier, key(i), ctx).name for i in range(4)]
    tier.submit_load(job(7, [key(0), key(1), key(2)], [9, 10, 11], True))
    tier.drain_jobs()
    res = [(r.job_id, r.success) for r in tier.get_finished_jobs()]
    view = np.frombuffer(spec.cpu_rows, dtype=np.uint8).reshape(-1, {row})
    print(json.dumps({{"verdicts": verdicts, "results": res,
                      "rows": [view[s].tobytes().hex() for s in (9, 10, 11)]}}))
    tier.shutdown()
""")


def test_store_restart_lookup_promote_corrupt(vllm_standin, tmp_path, rng):
    from vllm.v1.kv_offload.base import LookupResult, Medium, ReqContext
    root = tmp_path / "fs"
    spec, tier = make_tier(root, max_bytes=64 * ROW)
    rows = np.frombuffer(spec.cpu_rows, dtype=np.uint8).reshape(NUM_ROWS, ROW)
    rows[:3] = np.frombuffer(rng.randbytes(3 * ROW), dtype=np.uint8).reshape(3, ROW)
    written = [rows[i].tobytes() for i in range(3)]
    tier.submit_store(job(1, [key(0), key(1), key(2)], [0, 1, 2], False))
    tier.drain_jobs()
    assert [(r.job_id, r.success) for r in tier.get_finished_jobs()] == [(1, True)]
    ev = tier.take_events()
    assert [(e.medium, e.removed, sorted(e.keys)) for e in ev] == \
        [(Medium.STORAGE, False, [key(0), key(1), key(2)])]
    assert len(glob.glob(str(root / "**" / "*.bin"), recursive=True)) == 3
    tier.shutdown()

    # Restart: a new process finds the blocks (RETRY, then HIT) and promotes them intact.
    script = RESTART.format(standin=STANDIN, tests=os.path.dirname(__file__), root=str(root),
                            row=ROW)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["verdicts"] == ["HIT", "HIT", "HIT", "MISS"]
    assert got["results"] == [[7, True]]
    assert [bytes.fromhex(h) for h in got["rows"]] == written

    # Corrupt one file: the load of it fails (never served), it is removed and announced.
    spec, tier = make_tier(root)
    ctx = ReqContext(req_id="c")
    files = sorted(glob.glob(str(root / "**" / "*.bin"), recursive=True))
    victim = [f for f in files if os.path.basename(f).startswith(key(1)[:32].hex())]
    assert len(victim) == 1, files
    with open(victim[0], "r+b") as f:
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 0xFF]))
    assert settle(tier, key(1), ctx) is LookupResult.HIT  # the index still has it
    rows = np.frombuffer(spec.cpu_rows, dtype=np.uint8).reshape(NUM_ROWS, ROW)
    rows[5] = 0xAB
    tier.submit_load(job(8, [key(1)], [5], True))
    tier.drain_jobs()
    res = list(tier.get_finished_jobs())
    assert [(r.job_id, r.success) for r in res] == [(8, False)]
    assert not res[0].successful_keys
    ev = tier.take_events()
    assert any(e.removed and key(1) in e.keys and e.medium is Medium.STORAGE for e in ev), ev
    assert settle(tier, key(1), ReqContext(req_id="d")) is LookupResult.MISS
    assert not os.path.exists(victim[0])
    tier.shutdown()


def test_bounded_by_max_bytes(vllm_standin, tmp_path):
    from vllm.v1.kv_offload.base import Medium
    root = tmp_path / "fs"
    spec, tier = make_tier(root, max_bytes=2 * ROW)
    for j in range(4):
        tier.submit_store(job(j, [key(10 + j)], [j], False))
        tier.drain_jobs()
        assert [r.success for r in tier.get_finished_jobs()] == [True]
    ev = tier.take_events()
    removed = [k for e in ev if e.removed for k in e.keys]
    assert len(removed) == 2 and all(e.medium is Medium.STORAGE for e in ev)
    assert len(glob.glob(str(root / "**" / "*.bin"), recursive=True)) == 2
    tier.shutdown()
