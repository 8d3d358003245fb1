"""Stand-in of vllm/v1/kv_offload/tiering/factory.py: builds each secondary tier from its config
entry; out-of-tree types come from module_path; every tier gets backpressure_detector=..."""
import importlib
import logging

from vllm.v1.kv_offload.tiering.base import SecondaryTierManager

logger = logging.getLogger(__name__)


class BackpressureDetector:
    pass


class SecondaryTierFactory:
    _registry: dict[str, tuple[str, str]] = {
        "fs": ("vllm.v1.kv_offload.tiering.fs", "FileSystemTierManager"),
        "example": ("vllm.v1.kv_offload.tiering.example", "ExampleTierManager"),
    }

    @classmethod
    def create(cls, tier_config: dict, offloading_spec, primary_kv_view: memoryview):
        kwargs = dict(tier_config)
        tier_type = kwargs.pop("type")
        module_path = kwargs.pop("module_path", None)
        if tier_type in cls._registry:
            mod, name = cls._registry[tier_type]
            tier_cls = getattr(importlib.import_module(mod), name)
        else:
            if module_path is None:
                raise ValueError(f"Unknown secondary tier type: {tier_type}")
            logger.warning("Out-of-tree secondary tiers are experimental")
            tier_cls = getattr(importlib.import_module(module_path), tier_type)
            if not issubclass(tier_cls, SecondaryTierManager):
                raise TypeError(f"{tier_type} is not a SecondaryTierManager")
        return tier_cls(offloading_spec=offloading_spec, primary_kv_view=primary_kv_view,
                        tier_type=tier_type, backpressure_detector=BackpressureDetector(),
                        **kwargs)
