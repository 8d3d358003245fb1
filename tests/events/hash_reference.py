#!/usr/bin/python3
"""Reference vLLM block hashes (vllm-compat.md A.7), computed the way vLLM computes them.

Usage: hash_reference.py CASES.json [--preimage]

CASES.json: {"cases": [{"algo": "sha256" | "sha256_cbor", "seed": str, "block_size": int,
                        "tokens": [int...], "extra_keys": [null | [key...], ...]}, ...]}
where a key is a JSON string (str), an integer (int), {"bytes": "<hex>"} (bytes) or an array
(a nested tuple). extra_keys[i] applies to block i; missing entries mean None.

Prints one line per case: "<none_hash_hex> <h0_hex> <h1_hex> ..." (with --preimage, the hex of
the bytes that were hashed instead of the digests). Needs Debian's python3-cbor2; exits 3 with a
message when cbor2 is missing.
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


def encode(algo, obj):
    # vllm/utils/hashing.py: sha256 / sha256_cbor.
    if algo == "sha256":
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    if algo == "sha256_cbor":
        return cbor2.dumps(obj, canonical=True)
    raise ValueError(f"unknown algo {algo!r}")


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
        digest = hashlib.sha256(data).digest()
        out.append(data.hex() if want_preimage else digest.hex())
        return digest

    # kv_cache_utils.init_none_hash: hash_fn(os.environ["PYTHONHASHSEED"]), a str.
    none_hash = emit(case["seed"])
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
