#!/usr/bin/python3
"""Baselines for `kvo bench events`, run with Debian's python3 (python3-msgpack, python3-zmq).

Modes (each prints one JSON object):
  encode  N_BLOCKS TOKENS SECONDS      msgpack.packb of the same batch, block events/s
  decode  FILE SECONDS                 msgpack.unpackb of the exact bytes kvo produced, batches/s
  pubsub  N_BLOCKS TOKENS N_BATCHES    vLLM's ZmqEventPublisher loop (bounded Queue, one thread,
                                       seq counter, encode, 3-frame send, replay deque) feeding a
                                       SUB that decodes each batch, over ipc; batches/s end to end

msgspec is not packaged by Debian; msgpack-python's C extension stands in for it
(docs/ARCHITECTURE.md §5.1: this emulation measured 24-57 k batches/s on a machine like ours).
"""
import json
import os
import queue
import sys
import tempfile
import threading
import time
from collections import deque
from itertools import count

import msgpack
import zmq


def make_batch(n_blocks, tokens_per_block, i=0):
    return [1700000000.5 + i, [{
        "type": "BlockStored",
        "block_hashes": [(0x9E3779B97F4A7C15 * (i * n_blocks + b + 1)) & (2**64 - 1)
                         for b in range(n_blocks)],
        "parent_block_hash": None,
        "token_ids": list(range(n_blocks * tokens_per_block)),
        "block_size": 16, "lora_id": None, "medium": "GPU", "lora_name": None,
        "extra_keys": [None] * n_blocks, "group_idx": 0,
        "kv_cache_spec_kind": "full_attention"}], 0]


def timed(fn, seconds):
    n, start = 0, time.perf_counter()
    while True:
        for _ in range(100):
            fn()
        n += 100
        el = time.perf_counter() - start
        if el >= seconds:
            return n / el


def encode(n_blocks, tokens, seconds):
    batch = make_batch(n_blocks, tokens)
    rate = timed(lambda: msgpack.packb(batch, use_bin_type=True), seconds)
    return {"batches_per_s": rate, "block_events_per_s": rate * n_blocks}


def decode(path, seconds):
    data = open(path, "rb").read()
    rate = timed(lambda: msgpack.unpackb(data, raw=False), seconds)
    return {"batches_per_s": rate}


class VllmStylePublisher:
    """The loop of vllm/distributed/kv_events.py ZmqEventPublisher (A.4), msgpack for msgspec."""

    def __init__(self, ctx, endpoint, max_queue_size=100_000, buffer_steps=10_000):
        self._pub = ctx.socket(zmq.PUB)
        self._pub.set_hwm(0)
        self._pub.bind(endpoint)
        self._queue = queue.Queue(maxsize=max_queue_size)
        self._buffer = deque(maxlen=buffer_steps)
        self._seq_gen = count()
        self._topic = b"kv"
        self._running = True
        self._thread = threading.Thread(target=self._run, daemon=True, name="zmq-publisher")
        self._thread.start()

    def publish(self, batch):
        self._queue.put(batch)

    def _run(self):
        while self._running or not self._queue.empty():
            try:
                event = self._queue.get(timeout=0.1)
                if event is None:
                    break
            except queue.Empty:
                continue
            seq = next(self._seq_gen)
            payload = msgpack.packb(event, use_bin_type=True)
            seq_bytes = seq.to_bytes(8, "big")
            self._pub.send_multipart((self._topic, seq_bytes, payload))
            self._buffer.append((seq, payload))
            self._queue.task_done()

    def shutdown(self):
        self._running = False
        self._queue.put_nowait(None)
        self._thread.join(timeout=5)
        self._pub.close(linger=0)


def pubsub(n_blocks, tokens, n_batches):
    ctx = zmq.Context.instance()
    d = tempfile.mkdtemp()
    ep = "ipc://" + os.path.join(d, "pub")
    pub = VllmStylePublisher(ctx, ep)
    sub = ctx.socket(zmq.SUB)
    sub.set_hwm(0)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv")
    sub.connect(ep)
    # Handshake: publish probes until the subscriber sees one (no sleeps).
    while True:
        pub.publish(make_batch(1, 0))
        if sub.poll(10):
            break
    while sub.poll(50):
        sub.recv_multipart()
    batches = [make_batch(n_blocks, tokens, i) for i in range(64)]
    got = 0
    start = time.perf_counter()

    def produce():
        for i in range(n_batches):
            pub.publish(batches[i % 64])

    producer = threading.Thread(target=produce)
    producer.start()
    while got < n_batches:
        if not sub.poll(5000):
            break
        _, seq, payload = sub.recv_multipart()
        msgpack.unpackb(payload, raw=False)
        got += 1
    elapsed = time.perf_counter() - start
    producer.join()
    pub.shutdown()
    sub.close(linger=0)
    return {"batches_per_s": got / elapsed, "block_events_per_s": got * n_blocks / elapsed,
            "received": got}


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "encode":
        out = encode(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
    elif mode == "decode":
        out = decode(sys.argv[2], float(sys.argv[3]))
    elif mode == "pubsub":
        out = pubsub(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
    else:
        sys.exit("unknown mode " + mode)
    print(json.dumps(out))
