"""kvo: a KV-cache offload manager for vLLM, in C++ (https://github.com/... kvo).

`kvo.OffloadManager` is kvo's C++ manager with vLLM's OffloadingManager method names and
semantics; keys are vLLM's OffloadKey bytes (block hash + 4-byte big-endian group), slot ids numpy
int64 arrays. `kvo.vllm` holds the adapters vLLM loads by config (imported lazily: importing kvo
never imports vLLM).
"""
# The compiled module lives next to these sources once installed, or in a build tree's
# python/kvo/ during development: let the package span both.
__path__ = __import__("pkgutil").extend_path(__path__, __name__)

from kvo._kvo import (  # noqa: E402
    ContractError,
    LookupResult,
    OffloadingEvent,
    PrepareStoreOutput,
    TransferEngine,
    transfer_engines,
)
from kvo._config import (  # noqa: E402
    OffloadManager,
    make_offload_key,
    offload_key_parts,
    read_journal,
)

__all__ = [
    "ContractError",
    "LookupResult",
    "OffloadManager",
    "OffloadingEvent",
    "PrepareStoreOutput",
    "TransferEngine",
    "make_offload_key",
    "offload_key_parts",
    "read_journal",
    "transfer_engines",
]
