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
    ({"locality": "nowhere"}, "is not a valid Locality"),  # vLLM's message
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


_JOURNAL_CHILD = textwrap.dedent("""
    import os, signal, sys
    sys.path[:0] = [sys.argv[1], os.path.dirname(sys.argv[1])]
    from conftest import make_offloading_config
    from vllm.v1.kv_offload import base
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory
    import json
    cfg = json.loads(sys.argv[2])
    spec = OffloadingSpecFactory.create_spec(make_offloading_config(cfg))
    m = spec.get_manager()
    ctx = base.ReqContext(req_id="r")
    keys = [bytes([i]) * 32 + b"\\0\\0\\0\\0" for i in range(1, 5)]
    out = m.prepare_store(keys, ctx)
    m.complete_store(out.keys_to_store, ctx)
    for _ in range(100):  # the cascade to the file tier, waited for by draining (no sleeps)
        m.native.drain_tiers()
        m.on_schedule_end(base.ScheduleEndContext((), ()))
        if not m.has_pending_work():
            break
    events = list(m.take_events())
    print(json.dumps([[e.medium.value, e.removed, len(e.keys)] for e in events]), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # no shutdown: the journal must already hold them
""")


def test_journal_dir_survives_a_killed_process(vllm_standin, tmp_path):
    """KvoOffloadingSpec with journal_dir: the manager's events are journaled as take_events hands
    them to vLLM; after the process is killed, a new manager recovers from the journal (the CPU
    tier announced removed), lookups hit what the file tier holds, and the journal replays."""
    from vllm.v1.kv_offload import base
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory
    import kvo
    cfg = {"spec_name": "KvoOffloadingSpec", "spec_module_path": "kvo.vllm",
           "cpu_bytes_to_use": NUM_ROWS * ROW, "rows_dir": str(tmp_path),
           "journal_dir": str(tmp_path / "journal"),
           "secondary_tiers": [{"type": "fs", "root_dir": str(tmp_path / "fs"),
                                "n_read_threads": 1, "n_write_threads": 1,
                                "enable_kv_events": True}]}
    tests = os.path.dirname(os.path.abspath(__file__))
    child = subprocess.run([sys.executable, "-c", _JOURNAL_CHILD, STANDIN, json.dumps(cfg)],
                           capture_output=True, text=True, timeout=120, cwd=tests)
    assert child.returncode == -9, child.stderr[-2000:]
    taken = json.loads(child.stdout.strip().splitlines()[-1])
    assert ["CPU", False, 4] in taken and ["STORAGE", False, 4] in taken, taken

    journal = str(tmp_path / "journal" / "dp0")
    def count(records):  # block hashes per (kind, medium, reason)
        c = {}
        for _, _, evs in records:
            for kind, hashes, medium, reason in evs:
                c[(kind, medium, reason)] = c.get((kind, medium, reason), 0) + len(hashes)
        return c
    before = kvo.read_journal(journal)
    assert count(before) == {("BlockStored", "CPU", None): 4,
                             ("BlockStored", "STORAGE", None): 4}, count(before)

    spec = OffloadingSpecFactory.create_spec(make_offloading_config(cfg))
    m = spec.get_manager()
    assert m.native.recovered
    ctx = base.ReqContext(req_id="r2")
    keys = [bytes([i]) * 32 + b"\0\0\0\0" for i in range(1, 5)]
    first = [m.lookup(k, ctx) for k in keys]
    assert all(r in (base.LookupResult.RETRY, base.LookupResult.HIT_PENDING) for r in first), first
    for _ in range(100):  # vLLM's asynchronous lookup: RETRY until a step ends
        m.native.drain_tiers()
        m.on_schedule_end(base.ScheduleEndContext((), ()))
        if all(m.lookup(k, ctx) is not base.LookupResult.RETRY for k in keys):
            break
    settled = [m.lookup(k, ctx) for k in keys]  # on the file tier: promoted into CPU
    assert all(r in (base.LookupResult.HIT, base.LookupResult.HIT_PENDING) for r in settled), \
        settled
    m.shutdown()
    after = kvo.read_journal(journal)
    assert [r[0] for r in after[:len(before)]] == [r[0] for r in before]
    assert count(after[len(before):]).get(("BlockRemoved", "CPU", "restart")) == 4, \
        count(after[len(before):])
    with pytest.raises(ValueError, match="journal_dir"):
        OffloadingSpecFactory.create_spec(make_offloading_config(dict(cfg, journal_dir=5)))
    with pytest.raises(ValueError, match="journal_fsync"):
        OffloadingSpecFactory.create_spec(make_offloading_config(dict(cfg, journal_fsync="x")))
