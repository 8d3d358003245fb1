"""Stand-in of vllm/v1/kv_offload/tiering/base.py (vllm-plugin.md section 7)."""
from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from vllm.v1.kv_offload.base import (LookupResult, Medium, OffloadKey, ReqContext,
                                     RequestOffloadingContext)


@dataclass
class TransferJob:
    job_id: int
    keys: Collection[OffloadKey]
    block_ids: np.ndarray
    is_promotion: bool
    req_context: ReqContext


@dataclass
class JobResult:
    job_id: int
    success: bool
    successful_keys: Collection[OffloadKey] | None = None
    transfer_time: float | None = None


class SecondaryTierManager(ABC):
    medium: ClassVar[Medium | None] = None

    def __init__(self, offloading_spec, primary_kv_view: memoryview, tier_type: str) -> None:
        self._offloading_spec = offloading_spec
        self._primary_kv_view = primary_kv_view
        self.tier_type = tier_type

    @abstractmethod
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult: ...

    @abstractmethod
    def submit_store(self, job_metadata: TransferJob) -> None: ...

    @abstractmethod
    def submit_load(self, job_metadata: TransferJob) -> None: ...

    @abstractmethod
    def get_finished_jobs(self) -> Iterable[JobResult]: ...

    @abstractmethod
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext: ...

    @abstractmethod
    def drain_jobs(self) -> None: ...

    def has_pending_work(self) -> bool:
        return False

    def take_events(self):
        return ()

    def touch(self, keys, req_context) -> None:
        return

    def on_request_finished(self, req_context) -> None:
        return

    def on_schedule_end(self, context) -> None:
        return

    def shutdown(self) -> None:
        return

    @classmethod
    def build_metric_definitions(cls, tier_config):
        return {}

    def get_stats(self):
        return None
