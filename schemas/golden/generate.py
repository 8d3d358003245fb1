#!/usr/bin/python3
"""Writes kvo's golden msgpack vectors with an independent encoder (Debian's python3-msgpack).

The shapes are vllm-compat.md A.3's examples plus the newer optional fields. msgspec's rules
(A.2) are reproduced by hand here: dicts keep insertion order (tag first, declaration order,
defaulted fields omitted when None), floats are float64, ints shortest, bytes are bin.
Run: /usr/bin/python3 schemas/golden/generate.py  (rewrites the .msgpack files beside it)
"""
import os
import msgpack

H1 = 0xB9807785AFEE48BB
H2 = 0xCB73EEAED59C009D
HERE = os.path.dirname(os.path.abspath(__file__))


def pack(obj):
    return msgpack.packb(obj, use_bin_type=True, use_single_float=False)


VECTORS = {
    # A.3 example 1: GPU prefix-cache store (202 bytes).
    "example1_gpu_store": [1700000000.5, [{
        "type": "BlockStored", "block_hashes": [H1, H2], "parent_block_hash": None,
        "token_ids": [1, 2, 3, 4, 5, 6, 7, 8], "block_size": 4, "lora_id": None,
        "medium": "GPU", "lora_name": None, "extra_keys": [None, None], "group_idx": 0,
        "kv_cache_spec_kind": "full_attention"}], 0],
    # A.3 example 2: eviction, then clear (99 bytes, given in full in A.3).
    "example2_remove_clear": [1700000001.0, [
        {"type": "BlockRemoved", "block_hashes": [H1], "medium": "GPU", "group_idx": 0},
        {"type": "AllBlocksCleared"}], 0],
    # A.3 example 3: legacy positional arrays (v0.23 and earlier).
    "example3_legacy_array": [1700000000.5, [
        ["BlockStored", [H1, H2], None, [1, 2, 3, 4, 5, 6, 7, 8], 4, None, "GPU", None, None, 0,
         "full_attention", None],
        ["BlockRemoved", [H1], "GPU", 0],
        ["AllBlocksCleared"]], 0],
    # A.3 example 4: CPU-offload placeholder store.
    "example4_cpu_placeholder": [1700000002.25, [{
        "type": "BlockStored", "block_hashes": [H2], "parent_block_hash": None,
        "token_ids": [], "block_size": 0, "lora_id": None, "medium": "CPU",
        "lora_name": None, "group_idx": 0}], 1],
    # Every optional field set; raw-bytes hashes (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0);
    # extra keys with a LoRA name, a multimodal (id, offset) tuple, and a digest; large ints.
    "full_fields_bytes_hashes": [1700000003.125, [
        {"type": "BlockStored", "block_hashes": [bytes(range(32)), bytes(range(32, 64))],
         "parent_block_hash": bytes([0xFF] * 32), "token_ids": [0, 127, 128, 255, 256, 65535,
                                                                65536, 4294967295, 4294967296],
         "block_size": 16, "lora_id": 7, "medium": "STORAGE", "lora_name": "adapter-a",
         "extra_keys": [["adapter-a", ["mm-1", 3]], [b"\x01\x02"]], "group_idx": 1,
         "kv_cache_spec_kind": "sliding_window", "kv_cache_spec_sliding_window": 4096,
         "locality": "REMOTE", "ownership": "SHARED", "session_id": "s-42"},
        {"type": "BlockRemoved", "block_hashes": [bytes(range(32))], "medium": "STORAGE",
         "group_idx": 1, "locality": "REMOTE", "ownership": "SHARED"}], 3],
}

if __name__ == "__main__":
    for name, obj in VECTORS.items():
        with open(os.path.join(HERE, name + ".msgpack"), "wb") as f:
            f.write(pack(obj))
