"""A stand-in for the parts of vLLM that load third-party offloading code (vLLM cannot be installed
here). Faithful to docs/vllm-plugin.md (vLLM main 2026-08-20,
7cfb97e33791): the same module paths, class names, signatures, defaults and call rules; no engine,
no torch. Only kvo's tests import it."""
__version__ = "0.0.0+standin.main.20260820"
