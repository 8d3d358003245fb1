import os
import random

import pytest


@pytest.fixture
def rng(request):
    """A seeded random.Random; the seed is printed (and shown on failure) so a run can be
    repeated with KVO_TEST_SEED=<seed>."""
    seed = int(os.environ.get("KVO_TEST_SEED", random.SystemRandom().randrange(1 << 32)))
    print(f"{request.node.name}: seed {seed} (KVO_TEST_SEED={seed} repeats it)")
    return random.Random(seed)


@pytest.fixture
def kvo_binary():
    path = os.environ.get("KVO_BINARY")
    if not path or not os.path.exists(path):
        pytest.skip("KVO_BINARY is not set (ctest sets it)")
    return path


STANDIN = os.path.join(os.path.dirname(__file__), "standin")


@pytest.fixture
def vllm_standin(monkeypatch):
    """vLLM's offloading interface (tests/standin/vllm) on sys.path."""
    import sys
    monkeypatch.syspath_prepend(STANDIN)
    yield
    for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")
                 or n == "kvo.vllm"]:
        del sys.modules[name]


def make_offloading_config(extra_config, *, worker_kv_bytes_per_block=16384, tokens_per_block=16,
                           blocks_per_chunk=1, world_size=1, rank=0, enable_kv_cache_events=True,
                           engine_id="kvo-test", model="test-model"):
    from vllm.v1.kv_offload.config import (OffloadingCacheConfig, OffloadingConfig,
                                           OffloadingGroupConfig, OffloadingModelConfig,
                                           OffloadingParallelConfig)
    return OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block, ("layer.0", "layer.1")),),
        worker_kv_bytes_per_block=worker_kv_bytes_per_block,
        enable_kv_cache_events=enable_kv_cache_events, extra_config=extra_config,
        engine_id=engine_id, model=OffloadingModelConfig(model, "bfloat16"),
        cache=OffloadingCacheConfig(tokens_per_hash=tokens_per_block,
                                    blocks_per_chunk=blocks_per_chunk),
        parallel=OffloadingParallelConfig(
            rank=rank, world_size=world_size, tp_size=world_size, pp_size=1, pcp_size=1,
            dcp_size=1, data_parallel_index=0, data_parallel_size=1,
            data_parallel_rank_local=None, is_parallelism_agnostic=False))
