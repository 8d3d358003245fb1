"""lookup's raw-CPython hot path (an exact bytes key, the previous call's request context) answers
exactly as the full path, and everything else still takes the full path with its messages: keys
of the wrong type or length, bytes subclasses and bytearrays, a new context, a shut-down manager.
Random call sequences (seed printed) compare every answer with a plain-Python model."""
import pytest

import kvo
from kvo import LookupResult


def key(i, group=0):
    return kvo.make_offload_key(i.to_bytes(8, "big"), group)


class Ctx:
    def __init__(self, req_id):
        self.req_id = req_id


def test_hot_path_answers_as_the_full_path(rng):
    m = kvo.OffloadManager(64)
    stored = set()
    ctxs = [None, "r1", Ctx("r2"), Ctx("r3")]
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
    c = Ctx("a")
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
