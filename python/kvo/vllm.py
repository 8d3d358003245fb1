"""The adapters vLLM loads by config (vLLM main as of 2026-08: one OffloadingConfig argument,
get_worker). Importing this module imports vLLM; importing `kvo` does not.

Whole spec (kvo's CPU tier, policies, file tiers, events):
    "kv_connector_extra_config": {"spec_name": "KvoOffloadingSpec", "spec_module_path": "kvo.vllm",
                                  "cpu_bytes_to_use": ..., ...}
A secondary tier under vLLM's own CPU tier:
    "kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": ...,
        "secondary_tiers": [{"type": "KvoFsTier", "module_path": "kvo.vllm", "root_dir": ...}]}
"""
from __future__ import annotations

import logging
import mmap
import os
from typing import Any, Iterable, Optional

import numpy as np

import kvo
from kvo import _kvo
from kvo._config import config_json

logger = logging.getLogger("kvo.vllm")

INTERFACE = "vLLM main as of 2026-08 (OffloadingSpec(config: OffloadingConfig), get_worker())"


def _import_vllm():
    try:
        import vllm  # noqa: F401
        from vllm.v1.kv_offload import base
    except ImportError as e:
        raise ImportError(f"kvo.vllm needs vLLM ({INTERFACE}); importing it failed: {e}") from None
    version = getattr(vllm, "__version__", "unknown")
    missing = [n for n in ("OffloadingWorker", "CanonicalKVCaches", "TransferResult")
               if not hasattr(base, n)]
    if missing or not hasattr(base.OffloadingSpec, "get_worker"):
        raise ImportError(
            f"kvo.vllm matches {INTERFACE}; this vLLM {version} has a different offloading "
            f"interface (missing: {', '.join(missing) or 'OffloadingSpec.get_worker'}; "
            "vLLM <= 0.25 used get_handlers() and a (vllm_config, kv_cache_config) constructor). "
            "Upgrade vLLM, or use an older kvo.")
    try:
        from vllm.v1.kv_offload import config as vconfig  # noqa: F401
    except ImportError:
        raise ImportError(
            f"kvo.vllm matches {INTERFACE}; this vLLM {version} has no "
            "vllm.v1.kv_offload.config.OffloadingConfig (added by vLLM #48150)") from None
    return vllm, base


_vllm, _base = _import_vllm()
try:
    from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec
    from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager
except ImportError as _e:
    raise ImportError(
        f"kvo.vllm matches {INTERFACE}; this vLLM {getattr(_vllm, '__version__', 'unknown')} "
        f"lacks part of it ({_e})") from None

_LOOKUP = {
    kvo.LookupResult.MISS: _base.LookupResult.MISS,
    kvo.LookupResult.HIT: _base.LookupResult.HIT,
    kvo.LookupResult.HIT_PENDING: _base.LookupResult.HIT_PENDING,
    kvo.LookupResult.RETRY: _base.LookupResult.RETRY,
}


def _request_context(policy: str):
    if policy == "request_level":
        return _base.RequestOffloadingContext(policy=_base.OffloadPolicy("request_level"))
    return _base.RequestOffloadingContext()


def _event(e) -> Any:
    loc = _base.Locality(e.locality) if e.locality else None
    return _base.OffloadingEvent(keys=list(e.keys), medium=_base.Medium(e.medium),
                                 removed=e.removed, locality=loc)


# ---- config translation ------------------------------------------------------------------

_KVO_SPEC_KEYS = ("spec_name", "spec_module_path")


def _kvo_extra_config(extra_config) -> dict:
    """The user's extra config as kvo's parser reads it: KvoOffloadingSpec acts as vLLM's
    TieringOffloadingSpec when secondary_tiers are given, else as its CPUOffloadingSpec."""
    c = {k: v for k, v in dict(extra_config).items() if k not in _KVO_SPEC_KEYS}
    if "secondary_tiers" in c:
        c["spec_name"] = "TieringOffloadingSpec"
    for k in ("rows_dir", "journal_dir", "journal_fsync"):
        c.pop(k, None)
    return c


def _journal_kwargs(extra_config, dp_index) -> dict:
    """kvo's journal keys for this engine: journal_dir/dp<index> (stable across restarts, unlike
    engine_id, so a restarted engine recovers from its own journal)."""
    d = extra_config.get("journal_dir")
    if d is None:
        return {}
    if not isinstance(d, str) or not d:
        raise ValueError(f"journal_dir: expected a non-empty str (a directory), got "
                         f"{type(d).__name__}")
    return {"journal_dir": os.path.join(d, f"dp{int(dp_index or 0)}"),
            "journal_fsync": extra_config.get("journal_fsync", "never")}


def _geometry(config) -> dict:
    return dict(
        worker_kv_bytes_per_block=int(config.worker_kv_bytes_per_block),
        gpu_block_size=int(config.groups[0].tokens_per_block) if config.groups else 16,
        tokens_per_hash=int(config.cache.tokens_per_hash),
        world_size=int(config.parallel.world_size),
        replicated_layout=bool(getattr(config, "replicated_layout", False)))


def _run(config) -> dict:
    p = config.parallel
    return {
        "model_name": config.model.name, "dtype": config.model.dtype,
        "tokens_per_hash": int(config.cache.tokens_per_hash),
        "tp_size": p.tp_size, "pp_size": p.pp_size, "pcp_size": p.pcp_size,
        # As vLLM's file tier (FileMapper, parallel_agnostic opted in): a parallelism-agnostic or
        # replicated layout collapses tp/pp/pcp/dcp to 1, so a TP=2 replicated writer and a TP=4
        # replicated reader share one namespace ("replicated_layout": true is hashed in).
        "dcp_size": p.dcp_size,
        "parallel_agnostic": bool(p.is_parallelism_agnostic)
        or bool(getattr(config, "replicated_layout", False)),
        "replicated_layout": bool(getattr(config, "replicated_layout", False)),
        # vLLM's FileMapper names the rank directory _r{parallel.rank}; rank 0 when the layout
        # is parallelism-agnostic or replicated (the C++ side applies that rule: BuildFsTier).
        "rank": int(p.rank),
        "groups": [(g.tokens_per_block, list(g.layer_names)) for g in config.groups],
    }


def _shared_rows(extra_config, engine_id: str, nbytes: int) -> mmap.mmap:
    """The CPU rows, shared by the scheduler (file tiers read and write them) and the workers
    (the transfer engine fills them): a file under rows_dir (default /dev/shm) per engine."""
    rows_dir = extra_config.get("rows_dir") or ("/dev/shm" if os.path.isdir("/dev/shm") else
                                                os.environ.get("TMPDIR", "/tmp"))
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in str(engine_id))[:100]
    path = os.path.join(rows_dir, f"kvo-{safe}.rows")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if os.fstat(fd).st_size < nbytes:
            os.ftruncate(fd, nbytes)
        return mmap.mmap(fd, nbytes)
    finally:
        os.close(fd)


# ---- the spec ----------------------------------------------------------------------------

class KvoOffloadingSpec(_base.OffloadingSpec):
    """vLLM's OffloadingSpec backed by kvo: every key of CPUOffloadingSpec and
    TieringOffloadingSpec with vLLM's defaults and rejections, plus kvo's (max_bytes on fs tiers,
    rows_dir, journal_dir / journal_fsync: a durable journal of the manager's events under
    journal_dir/dp<data-parallel index>, recovered from on restart)."""

    @classmethod
    def build_metric_definitions(cls, extra_config):
        return metric_definitions(_base, tiering="secondary_tiers" in (extra_config or {}))

    def __init__(self, config):
        super().__init__(config)
        self.replicated_layout = bool(getattr(config, "replicated_layout", False))
        self._kvo_config = _kvo_extra_config(self.extra_config)
        g = _geometry(config)
        # Validates the whole config in every process (vLLM's rejections, as ValueError).
        self.num_cpu_blocks, self.row_bytes, bpc = _kvo.row_bytes_for(
            config_json(self._kvo_config), g["worker_kv_bytes_per_block"], g["gpu_block_size"],
            g["tokens_per_hash"], g["world_size"], g["replicated_layout"])
        if bpc != self.blocks_per_chunk:
            raise ValueError(f"blocks_per_chunk: kvo derives {bpc} from the config, vLLM passed "
                             f"{self.blocks_per_chunk}")
        if _journal_kwargs(self.extra_config, 0) and not config.enable_kv_cache_events:
            # As vLLM's managers, kvo's emits events only under --kv-events-config.
            logger.warning("kvo: journal_dir is set but KV cache events are off "
                           "(--kv-events-config enable_kv_cache_events): the journal stays empty")
        fs = self.extra_config.get("journal_fsync", "never")
        if fs not in ("never", "batch", "interval"):
            raise ValueError(f"journal_fsync: expected \"never\", \"batch\" or \"interval\", "
                             f"got {str(fs)[:64]!r}")
        self._rows: Optional[mmap.mmap] = None

    def _cpu_rows(self):
        if self._rows is None:
            self._rows = _shared_rows(self.extra_config, self.config.engine_id,
                                      self.num_cpu_blocks * self.row_bytes)
        return self._rows

    def get_manager(self):
        for t in self._kvo_config.get("secondary_tiers") or []:
            _make_root(t)
        rows = self._cpu_rows() if self._kvo_config.get("secondary_tiers") else None
        cfg = dict(self._kvo_config)
        cfg.update(_journal_kwargs(self.extra_config, self.config.parallel.data_parallel_index))
        m = kvo.OffloadManager.from_config(
            cfg, enable_kv_cache_events=bool(self.config.enable_kv_cache_events),
            data_parallel_rank=self.config.parallel.data_parallel_index,
            cpu_rows=rows, **_geometry(self.config), **_run_kwargs(self.config))
        return KvoManager(m, int(self._kvo_config.get("store_threshold") or 0))

    def get_worker(self, kv_caches):
        return KvoWorker(self, kv_caches)


def _make_root(tier) -> None:
    """vLLM's file tier creates its root directory; so does kvo's, here."""
    root = tier.get("root_dir") if isinstance(tier, dict) else None
    if isinstance(root, str) and root:
        os.makedirs(root, exist_ok=True)


def _run_kwargs(config) -> dict:
    r = _run(config)
    return dict(model_name=r["model_name"], dtype=r["dtype"], groups=r["groups"],
                tp_size=r["tp_size"], pp_size=r["pp_size"], pcp_size=r["pcp_size"],
                dcp_size=r["dcp_size"], parallel_agnostic=r["parallel_agnostic"], rank=r["rank"])


class KvoManager(_base.OffloadingManager):
    """vLLM's OffloadingManager over kvo.OffloadManager (vLLM types in, vLLM types out)."""

    medium = _base.Medium.CPU

    def __init__(self, manager: kvo.OffloadManager, store_threshold: int = 0):
        self._m = manager
        self._store_threshold = store_threshold
        self._last = None  # the stats of the previous get_stats (kvo's counters are cumulative)

    @property
    def native(self) -> kvo.OffloadManager:
        return self._m

    def lookup(self, key, req_context):
        return _LOOKUP[self._m.lookup(key, req_context)]

    def prepare_load(self, keys, req_context):
        return CPULoadStoreSpec(self._m.prepare_load(keys, req_context))

    def touch(self, keys, req_context):
        self._m.touch(keys, req_context)

    def complete_load(self, keys, req_context):
        self._m.complete_load(keys, req_context)

    def prepare_store(self, keys, req_context):
        out = self._m.prepare_store(keys, req_context)
        if out is None:
            return None
        return _base.PrepareStoreOutput(keys_to_store=out.keys_to_store,
                                        store_spec=CPULoadStoreSpec(out.store_slots),
                                        evicted_keys=out.evicted_keys)

    def complete_store(self, keys, req_context, success: bool = True):
        self._m.complete_store(keys, req_context, success)

    def on_new_request(self, req_context):
        return _request_context(self._m.on_new_request(req_context))

    def on_request_finished(self, req_context):
        self._m.on_request_finished(req_context)

    def take_events(self):
        # reset_cache announces its CPU blocks removed (reason "cleared"), as ordinary events.
        return [_event(e) for e in self._m.take_events()]

    def on_schedule_end(self, context=None):
        self._m.on_schedule_end()

    def has_pending_work(self):
        return self._m.has_pending_work()

    def reset_cache(self):
        self._m.reset_cache()

    def get_stats(self):
        """vLLM's CPU-tier metrics (OffloadingConnectorStats) since the last call: the usage
        gauges, stores skipped, and the allocation-size histogram (each allocation observed at
        its bucket's upper bound: kvo keeps bucket counts, not sizes). None when this vLLM has
        no OffloadingConnectorStats."""
        try:
            from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
                OffloadingConnectorStats)
        except ImportError:
            return None
        s = self._m.get_stats()
        last, self._last = self._last, s
        stats = OffloadingConnectorStats()
        stats.set_gauge("vllm:kv_offload_cpu_cache_usage_perc", s["usage"])
        stats.set_gauge("vllm:kv_offload_cpu_cache_write_usage_perc", s["write_usage"])
        stats.set_gauge("vllm:kv_offload_cpu_cache_read_usage_perc", s["read_usage"])
        bounds = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576)
        values = []
        for i, n in enumerate(s["allocation_buckets"]):
            n -= last["allocation_buckets"][i] if last else 0
            values += [bounds[i]] * n
        if values:  # keep the sum exact: the last sample carries the difference
            values[-1] += (s["allocation_sum"] - (last["allocation_sum"] if last else 0)
                           - sum(values))
        for v in values:
            stats.observe_histogram("vllm:kv_offload_cpu_allocation_size", v)
        if self._store_threshold >= 2:
            stats.increase_counter("vllm:kv_offload_stores_skipped",
                                   s["stores_skipped"] - (last["stores_skipped"] if last else 0))
        return stats

    def shutdown(self):
        self._m.shutdown()


# ---- the worker --------------------------------------------------------------------------

def _tensor_info(t) -> tuple[int, int, int, bool]:
    """(data_ptr, num_blocks, block_stride_bytes, is_cuda) of a canonical KV tensor: a torch
    tensor, a numpy array, or any writable buffer viewed as (num_blocks, page) rows."""
    if hasattr(t, "data_ptr") and hasattr(t, "element_size"):  # torch.Tensor
        return (int(t.data_ptr()), int(t.shape[0]), int(t.stride(0)) * int(t.element_size()),
                bool(getattr(t, "is_cuda", False)))
    a = t if isinstance(t, np.ndarray) else np.frombuffer(t, dtype=np.int8)
    if a.ndim == 1:
        raise ValueError("kv_caches.tensors[i].tensor: a 1-D buffer has no block dimension")
    if not a.flags.writeable:
        raise ValueError("kv_caches.tensors[i].tensor: must be writable")
    return int(a.ctypes.data), int(a.shape[0]), int(a.strides[0]), False


class KvoWorker(_base.OffloadingWorker):
    """Moves blocks between vLLM's canonical KV tensors and kvo's CPU rows with kvo's transfer
    engine: the CUDA engine for CUDA tensors (their data_ptr()s registered with it), the host
    engine (memcpy on threads) for host tensors."""

    def __init__(self, spec: KvoOffloadingSpec, kv_caches, num_threads: int = 4):
        self._spec = spec
        cfg = spec.config
        tensors, cuda = [], []
        for i, ct in enumerate(kv_caches.tensors):
            ptr, n, stride, is_cuda = _tensor_info(ct.tensor)
            tensors.append((ptr, n, stride, int(ct.page_size_bytes)))
            cuda.append(is_cuda)
        if any(cuda) and not all(cuda):
            raise ValueError("kv_caches: a mix of CUDA and host tensors")
        engine = "cuda" if cuda and cuda[0] else "host"
        if engine not in _kvo.transfer_engines():
            raise RuntimeError("kv_caches are CUDA tensors but this kvo was built without CUDA "
                               "(python/README.md: build the extension where nvcc is found)")
        groups = [[(int(r.tensor_idx), int(r.page_size_bytes)) for r in refs]
                  for refs in kv_caches.group_data_refs]
        world = int(cfg.parallel.world_size)
        num_workers = 1 if spec.replicated_layout else world
        stream, device = 0, 0
        if engine == "cuda":
            import torch  # only with CUDA tensors
            device = int(kv_caches.tensors[0].tensor.device.index or 0)
            stream = int(torch.cuda.current_stream(device).cuda_stream)
        self._rows = spec._cpu_rows()
        self._engine = _kvo.TransferEngine(
            engine, tensors, groups, spec.blocks_per_chunk, num_workers,
            int(cfg.parallel.rank) % num_workers, mmap.PAGESIZE, self._rows,
            num_threads=num_threads, compute_stream=stream, device=device)
        if self._engine.row_stride != spec.row_bytes:
            raise ValueError(f"kv_caches: rows of {self._engine.row_stride} bytes, the config "
                             f"gives {spec.row_bytes}")
        self._jobs: dict[int, int] = {}  # engine job id -> vLLM job id
        self._by_vllm: dict[int, int] = {}

    def _submit(self, store: bool, job_id: int, gpu, cpu) -> bool:
        try:
            sizes = list(gpu.group_sizes) if gpu.group_sizes is not None else [len(gpu.block_ids)]
            indices = list(gpu.block_indices) if gpu.block_indices is not None else [0] * len(sizes)
            eid = self._engine.submit(store, np.asarray(gpu.block_ids, dtype=np.int64).tolist(),
                                      sizes, indices,
                                      np.asarray(cpu.block_ids, dtype=np.int64).tolist())
        except (ValueError, RuntimeError) as e:
            logger.error("kvo: %s job %d not submitted: %s", "store" if store else "load", job_id,
                         e)
            return False
        self._jobs[eid] = job_id
        self._by_vllm[job_id] = eid
        return True

    def submit_store(self, job_id, src_spec, dst_spec) -> bool:
        return self._submit(True, job_id, src_spec, dst_spec)

    def submit_load(self, job_id, src_spec, dst_spec) -> bool:
        return self._submit(False, job_id, dst_spec, src_spec)

    def get_finished(self):
        out = []
        for eid, ok, nbytes, seconds, err in self._engine.get_finished():
            job_id = self._jobs.pop(eid, None)
            if job_id is None:
                continue
            self._by_vllm.pop(job_id, None)
            if not ok:
                # Never a success: the bytes are not there (vLLM asserts and stops, which is
                # better than serving wrong KV).
                logger.error("kvo: transfer job %d failed: %s", job_id, err)
            out.append(_base.TransferResult(job_id=job_id, success=bool(ok),
                                            transfer_size=int(nbytes),
                                            transfer_time=float(seconds)))
        return out

    def wait(self, job_ids) -> None:
        for j in job_ids:
            eid = self._by_vllm.get(j)
            if eid is not None:
                self._engine.wait(eid)

    def shutdown(self) -> None:
        self._engine.wait_all()


# ---- the file tier under vLLM's CPU tier -------------------------------------------------

class KvoFsTier(SecondaryTierManager):
    """kvo's file tier as a vLLM secondary tier: vLLM's on-disk layout, bounded by max_bytes,
    restart-safe (the index is rebuilt from the directory), integrity-checked (a torn or corrupt
    file is a miss, deleted, and its removal reported), STORAGE events, vLLM's asynchronous
    lookup (RETRY, then the verdict after the step)."""

    medium = _base.Medium.STORAGE

    def __init__(self, offloading_spec, primary_kv_view, tier_type, **kwargs):
        super().__init__(offloading_spec, primary_kv_view, tier_type)
        known = set(_kvo.fs_tier_config_keys())
        tier = {"type": "fs"}
        for k, v in kwargs.items():
            if k in known:
                tier[k] = v
            elif k != "backpressure_detector":
                logger.warning("KvoFsTier: keyword %r is not used", str(k)[:64])
        locality = kwargs.get("locality")
        # vLLM's message for a bad locality ("'local' is not a valid Locality").
        self.locality = _base.Locality(locality) if locality is not None else None
        # The geometry is the view's, as vLLM's tier takes it: one row per block, the row's bytes
        # its first stride (vLLM hands a (num_blocks, row_bytes) view of the CPU tier).
        view = primary_kv_view if isinstance(primary_kv_view, memoryview) else \
            memoryview(primary_kv_view)
        if view.ndim < 2:
            raise ValueError(f"primary_kv_view: a {view.ndim}-D view has no block dimension "
                             "(vLLM hands the CPU tier as (num_blocks, row_bytes))")
        row_bytes = int(view.strides[0])
        cfg = {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": int(view.nbytes),
               "secondary_tiers": [tier]}
        _make_root(tier)
        # Events need the tier's enable_kv_events and the global flag (vLLM: kv_events_config).
        ev = getattr(offloading_spec, "kv_events_config", None)
        enabled = bool(ev.enable_kv_cache_events) if ev is not None else \
            bool(offloading_spec.config.enable_kv_cache_events)
        self._events_on = bool(kwargs.get("enable_kv_events")) and enabled
        self._tier = _kvo.FsTier(
            config_json(cfg), row_bytes, int(offloading_spec.blocks_per_chunk),
            _run(offloading_spec.config), view, enabled)
        self._failed: list = []
        self._events: list = []  # taken from the tier by a read of `events`, not yet handed out

    @property
    def events(self):
        """vLLM's tier attribute: None when this tier emits no events (its enable_kv_events or
        the global KV-events flag off), else the events not yet taken."""
        if not self._events_on:
            return None
        self._events.extend(self._event(e) for e in self._tier.take_events())
        return self._events

    def _event(self, e):
        keys, medium, removed, loc, _reason = e
        return _base.OffloadingEvent(keys=keys, medium=_base.Medium(medium), removed=removed,
                                     locality=_base.Locality(loc) if loc else None)

    def lookup(self, key, req_context):
        return _LOOKUP[self._tier.lookup(key, req_context)]

    def _submit(self, store: bool, job) -> None:
        try:
            (self._tier.submit_store if store else self._tier.submit_load)(
                job.job_id, job.keys, job.block_ids, job.req_context)
        except (ValueError, OSError, RuntimeError, KeyError) as e:
            logger.error("KvoFsTier: job %d not started: %s", job.job_id, e)
            self._failed.append(JobResult(job_id=job.job_id, success=False))

    def submit_store(self, job_metadata) -> None:
        self._submit(True, job_metadata)

    def submit_load(self, job_metadata) -> None:
        self._submit(False, job_metadata)

    def get_finished_jobs(self) -> Iterable:
        out, self._failed = self._failed, []
        for job_id, ok, keys, _lost in self._tier.take_finished():
            # vLLM: successful_keys only for a failed job with some keys done, else None.
            out.append(JobResult(job_id=job_id, success=ok,
                                 successful_keys=tuple(keys) if keys else None))
        return out

    def on_new_request(self, req_context):
        return _request_context(self._tier.on_new_request(req_context))

    def drain_jobs(self) -> None:
        self._tier.drain()

    def has_pending_work(self) -> bool:
        return self._tier.has_pending_work()

    def take_events(self):
        out, self._events = self._events, []
        out.extend(self._event(e) for e in self._tier.take_events())
        return out

    def touch(self, keys, req_context) -> None:
        self._tier.touch(keys, req_context)

    def on_request_finished(self, req_context) -> None:
        self._tier.on_request_finished(req_context)

    def on_schedule_end(self, *args) -> None:
        self._tier.on_schedule_end()

    def shutdown(self) -> None:
        self._tier.shutdown()

    @classmethod
    def build_metric_definitions(cls, tier_config):
        return {}

    def get_stats(self):
        return None


# ---- metrics -----------------------------------------------------------------------------

def metric_definitions(base, tiering: bool) -> dict:
    """Prometheus metric definitions under vLLM's names (the tiering family renamed
    block -> chunk by vLLM #52812) and kvo's own."""
    C, G, H = (base.OffloadingCounterMetadata, base.OffloadingGaugeMetadata,
               base.OffloadingHistogramMetadata)
    d = {
        "vllm:kv_offload_cpu_allocation_size": H(
            documentation="Blocks allocated per prepare_store",
            buckets=(1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144)),
        "kvo:offload_lookups": C(documentation="CPU tier lookups"),
        "kvo:offload_hits": C(documentation="CPU tier hits (HIT or HIT_PENDING)"),
        "kvo:offload_evictions": C(documentation="CPU blocks evicted"),
        "kvo:offload_store_failures": C(documentation="prepare_store answered cannot-store"),
        "kvo:offload_cpu_usage": G(documentation="Pinned fraction of the CPU tier"),
    }
    if tiering:
        lab = ("tier",)
        d.update({
            "vllm:kv_offload_tiering_chunk_queries": C(documentation="Tier lookups",
                                                       labelnames=lab),
            "vllm:kv_offload_tiering_chunk_hits": C(documentation="Tier hits", labelnames=lab),
            "vllm:kv_offload_tiering_promotion_job_failures": C(
                documentation="Failed promotion jobs", labelnames=lab),
            "vllm:kv_offload_tiering_cascade_job_failures": C(
                documentation="Failed cascade jobs", labelnames=lab),
        })
    return d


__all__ = ["KvoOffloadingSpec", "KvoManager", "KvoWorker", "KvoFsTier", "metric_definitions",
           "INTERFACE"]
