"""kvo.OffloadManager construction from a vLLM user's config, and key helpers."""
from __future__ import annotations

import json
from typing import Any, Mapping, Optional, Sequence, Tuple

from kvo._kvo import OffloadManager, read_journal

__all__ = ["OffloadManager", "make_offload_key", "offload_key_parts", "config_json",
           "read_journal"]


def make_offload_key(block_hash: bytes, group_idx: int = 0) -> bytes:
    """vLLM's make_offload_key: block_hash + group_idx as 4 big-endian bytes."""
    if not isinstance(block_hash, (bytes, bytearray)):
        raise TypeError(f"block_hash: expected bytes, got {type(block_hash).__name__}")
    if not 1 <= len(block_hash) <= 32:
        raise ValueError(f"block_hash: 1..32 bytes, got {len(block_hash)}")
    return bytes(block_hash) + int(group_idx).to_bytes(4, "big")


def offload_key_parts(key: bytes) -> Tuple[bytes, int]:
    """(block_hash, group_idx) of an OffloadKey."""
    return bytes(key[:-4]), int.from_bytes(key[-4:], "big")


def config_json(extra_config: Mapping[str, Any]) -> str:
    """The extra config as the JSON kvo's C++ parser reads (same rules as vLLM's dict)."""
    if not isinstance(extra_config, Mapping):
        raise TypeError(
            f"kv_connector_extra_config: expected a dict, got {type(extra_config).__name__}")
    try:
        return json.dumps(dict(extra_config), allow_nan=False)
    except (TypeError, ValueError) as e:
        bad = next((k for k, v in extra_config.items() if not _jsonable(v)), None)
        where = f"kv_connector_extra_config[{str(bad)[:64]!r}]" if bad is not None else \
            "kv_connector_extra_config"
        raise ValueError(f"{where}: not a JSON value ({type(e).__name__})") from None


def _jsonable(v: Any) -> bool:
    try:
        json.dumps(v, allow_nan=False)
        return True
    except (TypeError, ValueError):
        return False


def _from_config(extra_config: Mapping[str, Any], *, worker_kv_bytes_per_block: int,
                 gpu_block_size: int = 16, tokens_per_hash: Optional[int] = None,
                 world_size: int = 1, replicated_layout: bool = False,
                 enable_kv_cache_events: bool = False,
                 data_parallel_rank: Optional[int] = None, model_name: str = "model",
                 dtype: str = "float16",
                 groups: Optional[Sequence[Tuple[int, Sequence[str]]]] = None,
                 tp_size: int = 1, pp_size: int = 1, pcp_size: int = 1, dcp_size: int = 1,
                 parallel_agnostic: bool = False, cpu_rows: Any = None,
                 track_blocks: bool = False, rank: int = 0) -> OffloadManager:
    """A manager built as vLLM's connector builds its spec's manager: `extra_config` is the
    `kv_connector_extra_config` dict (CPUOffloadingSpec or TieringOffloadingSpec keys, kvo's
    max_bytes / journal keys), the rest the geometry vLLM derives from the engine. `cpu_rows`
    (a writable buffer of num_blocks * row_bytes) is where file tiers read and write CPU rows;
    without it the rows are reserved lazily in this process. `rank` (vLLM's parallel.rank) names
    the file tiers' rank directory <namespace>_r<rank>, as vLLM's FileMapper does; it is 0 whatever
    is passed when `parallel_agnostic` (or replicated_layout) holds.

    kvo's journal keys: `journal_dir` (str) keeps a durable journal of the manager's events there
    (every take_events batch is appended and flushed: it survives a crash of the process); a
    manager built over a journal that already holds records is a restart (recovered: CPU blocks
    announced removed, file tiers reconciled with their directories). `journal_fsync`: "never"
    (default), "batch" or "interval" (also survive power loss)."""
    extra_config = dict(_mapping(extra_config))
    journal_dir = extra_config.pop("journal_dir", None)
    journal_fsync = extra_config.pop("journal_fsync", "never")
    if journal_dir is not None and (not isinstance(journal_dir, str) or not journal_dir):
        raise ValueError(f"journal_dir: expected a non-empty str (a directory), got "
                         f"{type(journal_dir).__name__}")
    if not isinstance(journal_fsync, str):
        raise ValueError(f"journal_fsync: expected \"never\", \"batch\" or \"interval\", got "
                         f"{type(journal_fsync).__name__}")
    run = {
        "model_name": model_name, "dtype": dtype,
        "tokens_per_hash": tokens_per_hash or gpu_block_size,
        "tp_size": tp_size, "pp_size": pp_size, "pcp_size": pcp_size, "dcp_size": dcp_size,
        "parallel_agnostic": parallel_agnostic, "replicated_layout": replicated_layout,
        "rank": rank,
        "groups": [(int(t), list(names)) for t, names in (groups or [(gpu_block_size, [])])],
    }
    return OffloadManager._from_config_json(
        config_json(extra_config), worker_kv_bytes_per_block, gpu_block_size,
        tokens_per_hash or gpu_block_size, world_size, replicated_layout,
        enable_kv_cache_events, data_parallel_rank, run, cpu_rows, track_blocks,
        journal_dir, journal_fsync)


def _mapping(extra_config: Any) -> Mapping[str, Any]:
    if not isinstance(extra_config, Mapping):
        raise TypeError(
            f"kv_connector_extra_config: expected a dict, got {type(extra_config).__name__}")
    return extra_config


OffloadManager.from_config = staticmethod(_from_config)
