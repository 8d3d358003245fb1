"""kvo.OffloadManager: vLLM's OffloadingManager semantics over kvo's C++ manager."""
import json
import subprocess

import numpy as np
import pytest

import kvo
from kvo import LookupResult


def key(i, group=0):
    return kvo.make_offload_key(i.to_bytes(8, "big"), group)


def store(m, keys):
    out = m.prepare_store(keys)
    assert out is not None
    m.complete_store(out.keys_to_store)
    return out


def test_lookup_store_load_cycle():
    m = kvo.OffloadManager(4)
    assert m.lookup(key(1)) == LookupResult.MISS
    out = m.prepare_store([key(1), key(2)], "req-1")
    assert out.keys_to_store == [key(1), key(2)]
    assert out.store_slots.dtype == np.int64 and list(out.store_slots) == [0, 1]
    assert out.evicted_keys == []
    assert m.lookup(key(1)) == LookupResult.HIT_PENDING or m.lookup(key(1)) == LookupResult.MISS
    m.complete_store([key(1), key(2)])
    assert m.lookup(key(2)) == LookupResult.HIT
    slots = m.prepare_load([key(2), key(1)])
    assert slots.dtype == np.int64 and list(slots) == [1, 0]
    m.complete_load([key(2), key(1)])
    events = m.take_events()
    assert [(e.medium, e.removed, e.keys) for e in events] == [("CPU", False, [key(1), key(2)])]
    m.check_invariants()


def test_eviction_lru_and_cannot_store():
    m = kvo.OffloadManager(2)
    store(m, [key(1), key(2)])
    m.touch([key(1)])  # key(2) is now the least recent
    out = store(m, [key(3)])
    assert out.evicted_keys == [key(2)]
    assert list(out.store_slots) == [1]
    m.prepare_load([key(1), key(3)])  # both pinned: nothing can be evicted
    assert m.prepare_store([key(4)]) is None
    st = m.get_stats()
    assert st["num_blocks"] == 2 and st["store_failures"] == 1
    m.take_events()
    m.complete_load([key(1), key(3)])


def test_complete_store_failure_drops_pending():
    m = kvo.OffloadManager(2)
    m.prepare_store([key(1)])
    m.complete_store([key(1)], success=False)
    assert m.lookup(key(1)) == LookupResult.MISS
    assert m.take_events() == []


def test_contract_errors_raise_and_change_nothing():
    m = kvo.OffloadManager(2)
    with pytest.raises(kvo.ContractError):
        m.prepare_load([key(9)])
    with pytest.raises(kvo.ContractError):
        m.complete_load([key(9)])
    m.check_invariants()


def test_requests_and_schedule_calls():
    m = kvo.OffloadManager(2)
    assert m.on_new_request("r") == "block_level"

    class Ctx:
        req_id = "r2"
    assert m.on_new_request(Ctx()) == "block_level"
    m.on_schedule_end()
    assert m.has_pending_work() is False
    m.on_request_finished("r")
    store(m, [key(1)])
    m.reset_cache()
    assert m.lookup(key(1)) == LookupResult.MISS
    ev = m.take_events()
    # A reset announces the CPU blocks removed (reason "cleared"): what vLLM's consumers read.
    assert ev[-1].removed and ev[-1].reason == "cleared" and ev[-1].keys == [key(1)]
    m.shutdown()
    with pytest.raises(kvo.ContractError):
        m.lookup(key(1))
    m.shutdown()  # idempotent


def test_batch_prefix_lookup_and_packed():
    m = kvo.OffloadManager(16)
    keys = [key(i) for i in range(8)]
    store(m, keys[:5])
    assert m.lookup_prefix(keys) == (5, False)
    assert m.lookup_prefix_packed(b"".join(keys), 12) == (5, False)
    assert m.lookup_many(keys[4:6]) == [LookupResult.HIT, LookupResult.MISS]
    m.prepare_store([keys[5]])
    pending = m.lookup(keys[5])  # vLLM: HIT_PENDING for a block being written
    hits, deferred = m.lookup_prefix(keys)
    if pending == LookupResult.HIT_PENDING:
        assert (hits, deferred) == (6, True)
    else:
        assert (hits, deferred) == (5, False)


@pytest.mark.parametrize("bad,exc", [
    (b"", ValueError), (b"1234", ValueError), (b"x" * 37, ValueError),
    ("abcdefgh0000", TypeError), (12345, TypeError), (None, TypeError),
])
def test_bad_key_names_the_argument(bad, exc):
    m = kvo.OffloadManager(2)
    with pytest.raises(exc, match="^key"):
        m.lookup(bad)
    with pytest.raises(exc, match="^keys"):
        m.prepare_store([key(1), bad])
    m.check_invariants()
    assert m.get_stats()["num_pending_writes"] == 0


def test_bad_collections_and_contexts():
    m = kvo.OffloadManager(2)
    with pytest.raises(TypeError, match="keys"):
        m.prepare_store(key(1))  # one bytes object, not a collection
    with pytest.raises(TypeError, match="keys"):
        m.touch(5)
    with pytest.raises(TypeError, match="req_context"):
        m.lookup(key(1), 5)
    with pytest.raises(TypeError):
        kvo.OffloadManager(-1)
    empty = kvo.OffloadManager(0)  # vLLM allows a zero-capacity tier: nothing can be stored
    assert empty.prepare_store([key(1)]) is None
    with pytest.raises(ValueError, match="keys"):
        m.lookup_prefix_packed(b"x" * 13, 12)
    # generators and sets are collections too
    assert m.prepare_store(k for k in [key(1)]) is not None


def test_fuzz_argument_conversion(rng):
    """Random Python objects into every method: exceptions only, never a crash, invariants
    intact."""
    m = kvo.OffloadManager(8)
    pool = [None, 0, -1, 2**70, 1.5, float("nan"), "", "abc", b"", b"\x00" * 5, b"\xff" * 36,
            b"\x01" * 37, bytearray(b"\x02" * 12), [], [b"\x03" * 12], [None], (b"\x04" * 12,),
            {b"\x05" * 12: 1}, {1, 2}, object(), np.zeros(3), np.arange(12, dtype=np.uint8),
            memoryview(b"\x06" * 12), [[b"\x07" * 12]], iter([b"\x08" * 12]), type, ...]
    methods = ["lookup", "lookup_many", "lookup_prefix", "prepare_load", "touch",
               "complete_load", "prepare_store", "complete_store", "on_new_request",
               "on_request_finished"]
    for _ in range(3000):
        name = rng.choice(methods)
        nargs = rng.randrange(0, 4)
        args = [rng.choice(pool) for _ in range(nargs)]
        kwargs = {rng.choice(["keys", "key", "req_context", "success", "bogus"]): rng.choice(pool)
                  for _ in range(rng.randrange(0, 3))}
        try:
            getattr(m, name)(*args, **kwargs)
        except (TypeError, ValueError, KeyError, kvo.ContractError):
            pass
        for i, x in enumerate(pool):  # a used-up iterator is rebuilt
            if hasattr(x, "__next__") and any(x is a for a in args + list(kwargs.values())):
                pool[i] = iter([b"\x08" * 12])
    m.check_invariants()
    with pytest.raises(ValueError, match="keys"):
        m.lookup_prefix_packed(np.zeros((2, 3)), 12)


def test_from_config_cpu_spec():
    m = kvo.OffloadManager.from_config(
        {"cpu_bytes_to_use": 4 << 20, "block_size": 32},
        worker_kv_bytes_per_block=64 << 10, gpu_block_size=16)
    g = m.geometry()
    assert g["blocks_per_chunk"] == 2 and g["row_bytes"] == 128 << 10
    assert g["num_blocks"] == 32
    store(m, [key(1)])
    assert m.lookup(key(1)) == LookupResult.HIT


@pytest.mark.parametrize("cfg,match", [
    ({}, "cpu_bytes_to_use"),
    ({"cpu_bytes_to_use": 1 << 20, "block_size": 32, "blocks_per_chunk": 2}, "block_size"),
    ({"cpu_bytes_to_use": 1 << 20, "eviction_policy": "nope"}, "eviction_policy"),
    ({"cpu_bytes_to_use": 1 << 20, "block_size": 24}, "block_size"),
    ({"cpu_bytes_to_use": 1 << 20, "store_threshold": "2"}, "store_threshold"),
    ({"cpu_bytes_to_use": object()}, "cpu_bytes_to_use"),
])
def test_from_config_rejections(cfg, match):
    with pytest.raises(ValueError, match=match):
        kvo.OffloadManager.from_config(cfg, worker_kv_bytes_per_block=4096)


# ---- property test: the Python manager and `kvo manager ops` answer alike ----------------

def _random_ops(rng, n_keys, n_ops):
    ops = []
    for _ in range(n_ops):
        op = rng.choice(["lookup", "prepare_store", "complete_store", "prepare_load",
                         "complete_load", "touch", "take_events", "complete_store_fail"])
        keys = [f"{rng.randrange(n_keys):016x}" for _ in range(rng.randrange(1, 4))]
        if op == "complete_store_fail":
            ops.append({"op": "complete_store", "keys": keys, "success": False})
        elif op == "take_events":
            ops.append({"op": op})
        else:
            ops.append({"op": op, "keys": keys})
    return ops


def _py_answer(m, line):
    op = line["op"]
    keys = [bytes.fromhex(h) + b"\0\0\0\0" for h in line.get("keys", [])]
    hexes = lambda ks: [k[:-4].hex() for k in ks]  # noqa: E731
    try:
        if op == "lookup":
            r = [m.lookup(k).name for k in keys]
            return {"result": r[0]} if len(r) == 1 else {"results": r}
        if op == "prepare_store":
            out = m.prepare_store(keys)
            if out is None:
                return {"result": None}
            return {"keys_to_store": hexes(out.keys_to_store),
                    "slots": [int(s) for s in out.store_slots],
                    "evicted": hexes(out.evicted_keys)}
        if op == "complete_store":
            m.complete_store(keys, success=line.get("success", True))
            return {}
        if op == "prepare_load":
            return {"slots": [int(s) for s in m.prepare_load(keys)]}
        if op == "complete_load":
            m.complete_load(keys)
            return {}
        if op == "touch":
            m.touch(keys)
            return {}
        if op == "take_events":
            return {"events": [{"keys": hexes(e.keys), "medium": e.medium, "removed": e.removed}
                               for e in m.take_events()]}
    except (kvo.ContractError, ValueError):
        return {"error": None}
    raise AssertionError(op)


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_property_same_answers_as_cli(rng, kvo_binary, policy):
    for trial in range(20):
        num_blocks = rng.randrange(1, 6)
        ops = _random_ops(rng, n_keys=rng.randrange(2, 10), n_ops=60)
        threshold = rng.choice([0, 0, 2])
        cli = subprocess.run(
            [kvo_binary, "manager", "ops", "--num-blocks", str(num_blocks), "--policy", policy,
             "--store-threshold", str(threshold), "--ops", "-"],
            input="".join(json.dumps(o) + "\n" for o in ops), capture_output=True, text=True,
            check=True)
        answers = [json.loads(line) for line in cli.stdout.splitlines()]
        assert len(answers) == len(ops)
        m = kvo.OffloadManager(num_blocks, eviction_policy=policy, store_threshold=threshold)
        for i, (op, want) in enumerate(zip(ops, answers)):
            got = _py_answer(m, op)
            if "error" in want:
                want = {"error": None}
            assert got == want, f"trial {trial} op {i} {op}"
        m.check_invariants()


def test_lookup_call_forms_and_context_cache():
    m = kvo.OffloadManager(4)
    store(m, [key(1)])
    assert m.lookup(key(1)) == LookupResult.HIT
    assert m.lookup(key=key(1)) == LookupResult.HIT
    assert m.lookup(key(1), req_context="r") == LookupResult.HIT
    with pytest.raises(TypeError):
        m.lookup()
    with pytest.raises(TypeError):
        m.lookup(key(1), None, None)

    class Ctx:
        def __init__(self, req_id):
            self.req_id = req_id
    c = Ctx("a")
    for _ in range(3):  # the same context object again: converted once
        assert m.lookup(key(1), c) == LookupResult.HIT
    with pytest.raises(TypeError, match="req_context.req_id"):
        m.lookup(key(1), Ctx(5))
    assert m.lookup(key(2), c) == LookupResult.MISS


def test_store_call_forms_and_outputs():
    """prepare_store / complete_store take vLLM's keyword names; keys_to_store hands back the
    caller's own key objects (a subsequence of the input, first occurrences); evicted_keys is built
    on first read and then the same list."""
    m = kvo.OffloadManager(2)
    k = [key(i) for i in range(4)]
    out = m.prepare_store(keys=[k[0], k[1], k[0]], req_context="r")
    assert out.keys_to_store == [k[0], k[1]] and out.keys_to_store[0] is k[0]
    assert list(out.store_slots) == [0, 1] and out.store_slots.dtype == np.int64
    assert "2 to store" in repr(out)
    m.complete_store(out.keys_to_store, req_context="r", success=True)
    ba = bytearray(key(2))  # a bytearray key comes back as bytes
    out = m.prepare_store((ba,), "r")
    assert out.keys_to_store == [bytes(ba)] and type(out.keys_to_store[0]) is bytes
    assert out.evicted_keys == [k[0]] and out.evicted_keys is out.evicted_keys
    m.complete_store(keys=out.keys_to_store, success=False)
    assert m.lookup(bytes(ba)) == LookupResult.MISS
    out = m.prepare_store(iter([k[3]]))  # any iterable: keys built from the C++ side
    assert out.keys_to_store == [k[3]] and out.evicted_keys == []
    m.complete_store(out.keys_to_store, None, 1)
    assert m.lookup(k[3]) == LookupResult.HIT
    for bad in ({"keys": [k[0]], "nope": 1}, {"req_context": "r"}):
        with pytest.raises(TypeError):
            m.prepare_store(**bad)
    with pytest.raises(TypeError, match="multiple values"):
        m.complete_store([k[0]], keys=[k[0]])
    with pytest.raises(TypeError, match="at most 3"):
        m.complete_store([k[0]], "r", True, 4)

    class Bad:
        def __bool__(self):
            raise ValueError("no truth")
    with pytest.raises(ValueError, match="no truth"):
        m.complete_store([k[3]], "r", Bad())
    m.check_invariants()


def test_arc_state_inspection():
    """The ARC lists as vLLM's ARCCachePolicy names them (used to run vLLM's own ARC tests against
    kvo; python/README.md)."""
    m = kvo.OffloadManager(2, "arc")
    store(m, [key(1), key(2)])
    s = m._arc_state()
    assert s["t1"] == [key(1), key(2)] and s["t2"] == [] and s["cache_capacity"] == 2
    m.prepare_load([key(1)])
    m.complete_load([key(1)])
    m._arc_set_target_t1_size(1.0)
    assert m._arc_state()["target_t1_size"] == 1.0
    assert kvo.OffloadManager(2)._arc_state() is None


# ---- lookup's raw-CPython hot path (an exact bytes key, the previous call's request context)
# answers exactly as the full path, and everything else still takes the full path with its
# messages: keys of the wrong type or length, bytes subclasses and bytearrays, a new context, a
# shut-down manager. Random call sequences (seed printed) compare every answer with a model.

class _Ctx:
    def __init__(self, req_id):
        self.req_id = req_id


def test_hot_path_answers_as_the_full_path(rng):
    m = kvo.OffloadManager(64)
    stored = set()
    ctxs = [None, "r1", _Ctx("r2"), _Ctx("r3")]
    for step in range(3000):  # bounded
        op = rng.random()
        k = key(rng.randrange(96), rng.randrange(2))
        if op < 0.2:
            out = m.prepare_store([k])
            if out is not None and out.keys_to_store:
                m.complete_store(out.keys_to_store)
            for e in m.take_events():
                if e.removed:
                    stored.difference_update(e.keys)
                else:
                    stored.update(e.keys)
        else:
            ctx = rng.choice(ctxs)
            # Every call form: positional with or without the context, keyword, and a bytes
            # subclass / bytearray copy (the full path).
            form = rng.randrange(4)
            if form == 0:
                got = m.lookup(k, ctx)
            elif form == 1:
                got = m.lookup(k) if ctx is None else m.lookup(k, ctx)
            elif form == 2:
                got = m.lookup(key=k, req_context=ctx)
            else:
                got = m.lookup(bytearray(k), ctx)
            want = LookupResult.HIT if k in stored else LookupResult.MISS
            assert got == want, (step, k, ctx, form)
    m.check_invariants()


def test_bad_keys_after_the_context_is_cached():
    m = kvo.OffloadManager(4)
    c = _Ctx("a")
    assert m.lookup(key(1), c) == LookupResult.MISS  # c is now the cached context
    for bad, exc, words in [
        (b"", ValueError, "got 0 bytes"),
        (b"\0\0\0\0", ValueError, "got 4 bytes"),
        (b"x" * 37, ValueError, "got 37 bytes"),
        ("abcdefgh\0\0\0\0", TypeError, "must be bytes, got str"),
        (None, TypeError, "got NoneType"),
        (12345, TypeError, "got int"),
    ]:
        with pytest.raises(exc, match=words):
            m.lookup(bad, c)
        with pytest.raises(exc, match=words):
            m.lookup(bad)

    class B(bytes):
        pass
    store = m.prepare_store([key(2)])
    m.complete_store(store.keys_to_store)
    assert m.lookup(B(key(2)), c) == LookupResult.HIT
    assert m.lookup(key(2), c) == LookupResult.HIT
    m.shutdown()
    with pytest.raises(kvo.ContractError, match="shut down"):
        m.lookup(key(2), c)
