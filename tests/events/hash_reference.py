#!/usr/bin/python3
"""Reference vLLM block hashes (vllm-compat.md A.7), computed the way vLLM computes them.

Usage: hash_reference.py CASES.json [--preimage]

CASES.json: {"cases": [{"algo": "sha256" | "sha256_cbor" | "xxhash" | "xxhash_cbor",
                        "seed": str | null, "block_size": int,
                        "tokens": [int...], "extra_keys": [null | [key...], ...]}, ...]}
"seed": null is an engine without PYTHONHASHSEED: current vLLM's fixed "vllm-none-hash" for the
sha256 variants; for the xxhash variants (a random per-process seed in vLLM) the case's line is
"error: seed required".
where a key is a JSON string (str), an integer (int), {"bytes": "<hex>"} (bytes) or an array
(a nested tuple). extra_keys[i] applies to block i; missing entries mean None.

Prints one line per case: "<none_hash_hex> <h0_hex> <h1_hex> ..." (with --preimage, the hex of
the bytes that were hashed instead of the digests). Needs Debian's python3-cbor2 and
python3-xxhash; exits 3 with a message when either is missing.
"""
import hashlib
import json
import pickle
import sys

try:
    import cbor2
except ImportError:  # pragma: no cover
    sys.stderr.write("hash_reference.py: the cbor2 module is missing (apt install python3-cbor2)\n")
    sys.exit(3)
try:
    import xxhash
except ImportError:  # pragma: no cover
    sys.stderr.write("hash_reference.py: the xxhash module is missing (apt install python3-xxhash)\n")
    sys.exit(3)

# vllm/v1/core/kv_cache_utils.py: DEFAULT_NONE_HASH_SEED.
DEFAULT_NONE_HASH_SEED = "vllm-none-hash"


def encode(algo, obj):
    # vllm/utils/hashing.py: pickle (protocol 5) for sha256 / xxhash, canonical CBOR for the _cbor.
    if algo in ("sha256", "xxhash"):
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    if algo in ("sha256_cbor", "xxhash_cbor"):
        return cbor2.dumps(obj, canonical=True)
    raise ValueError(f"unknown algo {algo!r}")


def digest(algo, data):
    if algo.startswith("sha256"):
        return hashlib.sha256(data).digest()
    return xxhash.xxh3_128_digest(data)


def resolve_seed(algo, seed):
    # kv_cache_utils.resolve_none_hash_seed, minus os.urandom: PYTHONHASHSEED if set, else the
    # fixed default for the cryptographic algorithms; xxhash* have no reproducible default.
    if seed is not None:
        return seed
    if algo.startswith("sha256"):
        return DEFAULT_NONE_HASH_SEED
    return None


def to_key(j):
    if isinstance(j, bool) or j is None or isinstance(j, float):
        raise ValueError(f"unsupported extra key {j!r}")
    if isinstance(j, (str, int)):
        return j
    if isinstance(j, dict):
        return bytes.fromhex(j["bytes"])
    if isinstance(j, list):
        return tuple(to_key(e) for e in j)
    raise ValueError(f"unsupported extra key {j!r}")


def run_case(case, want_preimage):
    algo = case["algo"]
    assert pickle.HIGHEST_PROTOCOL == 5, pickle.HIGHEST_PROTOCOL
    out = []

    def emit(obj):
        data = encode(algo, obj)
        d = digest(algo, data)
        out.append(data.hex() if want_preimage else d.hex())
        return d

    # kv_cache_utils.init_none_hash: NONE_HASH = hash_fn(seed), seed a str.
    seed = resolve_seed(algo, case.get("seed"))
    if seed is None:
        return "error: seed required"
    none_hash = emit(seed)
    bs = case["block_size"]
    tokens = case["tokens"]
    extra = case.get("extra_keys") or []
    parent = None
    for i in range(len(tokens) // bs):
        keys = extra[i] if i < len(extra) else None
        keys = None if keys is None else to_key(keys)
        # kv_cache_utils.hash_block_tokens
        if not parent:
            parent = none_hash
        parent = emit((parent, tuple(tokens[i * bs:(i + 1) * bs]), keys))
    return " ".join(out)


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    want_preimage = "--preimage" in sys.argv[1:]
    if len(args) != 1:
        sys.stderr.write(__doc__)
        return 2
    with open(args[0], encoding="utf-8") as f:
        cases = json.load(f)["cases"]
    lines = [run_case(c, want_preimage) for c in cases]
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
