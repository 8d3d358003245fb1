"""Stand-in of vLLM's TieringOffloadingSpec, only as far as it loads secondary tiers: the CPU
rows are a bytearray (vLLM: pinned memory) handed to each tier as `primary_kv_view`."""
from vllm.v1.kv_offload.base import OffloadingSpec
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory


class TieringOffloadingSpec(OffloadingSpec):
    def __init__(self, config, num_cpu_blocks: int | None = None, row_bytes: int | None = None):
        super().__init__(config)
        cpu_bytes = int(self.extra_config["cpu_bytes_to_use"])
        self.row_bytes = row_bytes or config.worker_kv_bytes_per_block * self.blocks_per_chunk
        self.num_cpu_blocks = num_cpu_blocks or cpu_bytes // self.row_bytes
        self.cpu_rows = bytearray(self.num_cpu_blocks * self.row_bytes)
        # vLLM's region hands its tiers a (num_blocks, row_bytes) uint8 view.
        self.primary_kv_view = memoryview(self.cpu_rows).cast(
            "B", (self.num_cpu_blocks, self.row_bytes))
        self.secondary_tiers = [
            SecondaryTierFactory.create(t, self, self.primary_kv_view)
            for t in self.extra_config.get("secondary_tiers", [])]

    def get_manager(self):
        raise NotImplementedError("stand-in")

    def get_worker(self, kv_caches):
        raise NotImplementedError("stand-in")
