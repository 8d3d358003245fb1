#!/usr/bin/env python3
"""`kvo route` over real processes and sockets.

Two fake engines (http.server threads in this process: the OpenAI routes, GET /kvo/state and
GET /kv_event_sources) whose event sources are real publishers (`kvo events publish`), a real
`kvo index serve`, and `kvo route` as a child process. Checks: registration through
/kv_event_sources, kv placement on the instance holding the prefix (and its predicted vs
delivered hit), streaming relayed chunk by chunk (the engine holds its second chunk until the
client has the first through the router), engine errors relayed, an engine down (retried on the
other and counted), none up (503 in OpenAI's shape), round-robin, /metrics and /route/stats,
bad flags. usage: route_test.py KVO_BINARY
"""
import http.client
import http.server
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

BLOCK = 4
DEADLINE_S = 15


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(url, body=None, method=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


class Engine:
    """A fake vLLM engine: answers completions, reports hit tokens it is told to report."""

    def __init__(self, name, pub, rep, hit_tokens):
        self.name, self.pub, self.rep, self.hit_tokens = name, pub, rep, hit_tokens
        self.requests = []
        self.conns = []  # open connections: stop() cuts them, as a dying process would
        self.release = threading.Event()  # the streaming answer's second chunk waits for it
        engine = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def setup(self):
                super().setup()
                engine.conns.append(self.connection)

            def reply(self, status, obj, ctype="application/json"):
                body = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if self.path == "/kvo/state":
                    return self.reply(200, {"instance_id": engine.name})
                if self.path == "/kv_event_sources":
                    return self.reply(200, {"sources": [{
                        "data_parallel_rank": 0, "endpoint": f"tcp://127.0.0.1:{engine.pub}",
                        "replay_endpoint": f"tcp://127.0.0.1:{engine.rep}", "topic": "kv"}]})
                if self.path == "/v1/models":
                    return self.reply(200, {"object": "list", "data": [{"id": "m", "owned_by": engine.name}]})
                return self.reply(404, {"error": {"message": "no such path"}})

            def do_POST(self):
                n = int(self.headers.get("Content-Length", "0"))
                req = json.loads(self.rfile.read(n))
                engine.requests.append(req)
                ids = req.get("prompt_token_ids") or req.get("prompt")
                if ids == [13]:
                    return self.reply(400, {"error": {"message": "engine says no", "type": "BadRequestError",
                                                      "param": "prompt", "code": 400}})
                kvo = {"instance_id": engine.name, "hit_tokens": {"GPU": engine.hit_tokens, "CPU": 0, "DISK": 0}}
                if not req.get("stream"):
                    return self.reply(200, {"object": "text_completion", "choices": [{"text": "hi"}],
                                            "kvo": kvo})
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()

                def chunk(text):
                    data = text.encode()
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    self.wfile.flush()
                chunk("data: " + json.dumps({"choices": [{"text": "first"}]}) + "\n\n")
                assert engine.release.wait(DEADLINE_S), "the client never saw the first chunk"
                chunk("data: " + json.dumps({"choices": [{"text": "second"}], "kvo": kvo}) + "\n\n")
                chunk("data: [DONE]\n\n")
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()
        for c in self.conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def stores(tokens, hashes, medium):
    out = []
    for i, h in enumerate(hashes):
        out.append({"ts": time.time(), "data_parallel_rank": 0, "events": [{
            "type": "BlockStored", "block_hashes": [h], "parent_block_hash": hashes[i - 1] if i else None,
            "token_ids": tokens[i * BLOCK:(i + 1) * BLOCK], "block_size": BLOCK, "lora_id": None,
            "medium": medium, "lora_name": None, "extra_keys": None, "group_idx": 0,
            "kv_cache_spec_kind": "full_attention"}]})
    return out


def start(cmd, procs):
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    procs.append(p)
    line = p.stdout.readline()
    assert line, f"{cmd[:3]} exited with {p.wait()}"
    return json.loads(line)


def main():
    kvo = sys.argv[1]
    seed = int(os.environ.get("KVO_TEST_SEED", str(random.randrange(1 << 30))))
    print(f"seed {seed}")
    rng = random.Random(seed)
    work = tempfile.mkdtemp(prefix="kvo-route-")
    procs, engines = [], []
    try:
        doc = [rng.randrange(1, 50000) for _ in range(BLOCK * 4)]
        other = [rng.randrange(1, 50000) for _ in range(BLOCK * 2)]
        ports = [free_port() for _ in range(4)]
        for name, (pub, rep), batches in (
                ("eng-a", ports[0:2], stores(doc, [seed + i + 1 for i in range(4)], "GPU")),
                ("eng-b", ports[2:4], stores(other, [seed + 100 + i for i in range(2)], "CPU"))):
            path = os.path.join(work, name + ".jsonl")
            with open(path, "w") as f:
                f.write("\n".join(json.dumps(b) for b in batches) + "\n")
            cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "topic": "kv",
                   "endpoint": f"tcp://127.0.0.1:{pub}", "replay_endpoint": f"tcp://127.0.0.1:{rep}"}
            procs.append(subprocess.Popen([kvo, "events", "publish", "--kv-events-config", json.dumps(cfg),
                                           "--input", path, "--linger-ms", str(DEADLINE_S * 2000)],
                                          stdout=subprocess.DEVNULL))
            engines.append(Engine(name, pub, rep, hit_tokens=len(doc) if name == "eng-a" else 0))
        idx = start([kvo, "index", "serve", "--db", os.path.join(work, "i.db"), "--http", "127.0.0.1:0"], procs)
        r = start([kvo, "route", "--indexer", idx["http"], "--engine", engines[0].url, "--engine", engines[1].url,
                   "--policy", "kv", "--block-size", str(BLOCK), "--model", "m"], procs)
        base = r["http"]
        assert [e["instance_id"] for e in r["engines"]] == ["eng-a", "eng-b"], r
        # Registered through /kv_event_sources: the indexer follows both publishers (replay).
        deadline = time.monotonic() + DEADLINE_S
        while True:
            srcs = json.loads(call(idx["http"] + "/v1/sources")[1])["sources"]
            seqs = {s["name"].split("@")[0]: s["last_sequence"] for s in srcs}
            if seqs.get("eng-a") == 3 and seqs.get("eng-b") == 1:
                break
            for p in procs:
                assert p.poll() is None, f"{p.args[:3]} exited with {p.returncode}"
            assert time.monotonic() < deadline, f"index never caught up: {seqs}"
            time.sleep(0.05)

        # kv: the prefix's holder gets every request that shares it (sequential: nothing in flight).
        for i in range(4):
            st, body = call(base + "/v1/completions", {"model": "m", "prompt": doc + [i], "max_tokens": 1})
            assert st == 200 and json.loads(body)["kvo"]["instance_id"] == "eng-a", (st, body)
        stats = json.loads(call(base + "/route/stats")[1])
        a = {i["instance_id"]: i for i in stats["instances"]}
        assert a["eng-a"]["decisions"] == 4 and a["eng-b"]["decisions"] == 0, stats
        assert a["eng-a"]["predicted_hit_tokens"] == 4 * len(doc), stats
        assert a["eng-a"]["delivered_hit_tokens"] == 4 * len(doc), stats
        assert stats["routing_latency_ms"]["count"] == 4, stats
        # The CPU-held prefix goes to eng-b.
        st, body = call(base + "/v1/completions", {"model": "m", "prompt_token_ids": other, "max_tokens": 1})
        assert st == 200 and json.loads(body)["kvo"]["instance_id"] == "eng-b", body

        # Streaming, chunk by chunk: the first chunk arrives before the engine writes the second.
        host, port = base[len("http://"):].split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=DEADLINE_S)
        conn.request("POST", "/v1/completions", json.dumps({"model": "m", "prompt": doc, "stream": True}),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200 and resp.getheader("Content-Type").startswith("text/event-stream")
        first = resp.read1(65536).decode()
        assert "first" in first and "second" not in first, first
        engines[0].release.set()
        rest = resp.read().decode()
        assert "second" in rest and rest.rstrip().endswith("data: [DONE]"), rest
        conn.close()

        # Engine errors are relayed as they are.
        st, body = call(base + "/v1/completions", {"model": "m", "prompt": [13]})
        assert st == 400 and json.loads(body)["error"]["message"] == "engine says no", (st, body)
        # Bad requests: 400 in OpenAI's shape, naming the field.
        st, body = call(base + "/v1/completions", {"model": "m", "max_tokens": 1})
        assert st == 400 and "prompt" in json.loads(body)["error"]["message"], body
        st, body = call(base + "/v1/models")
        assert st == 200 and json.loads(body)["object"] == "list", body
        # Unknown paths and methods are named cut short, never echoed whole (they were: a path
        # can be as long as the 16 KiB header limit).
        st, body = call(base + "/" + "z" * 8000)
        assert st == 404 and len(body) < 300 and "no such path" in body, (st, len(body))
        st, body = call(base + "/route/stats", method="M" * 5000)
        assert st == 405 and len(body) < 300, (st, len(body))

        # eng-a down: the request for its prefix is retried on eng-b and counted.
        engines[0].stop()
        st, body = call(base + "/v1/completions", {"model": "m", "prompt": doc, "max_tokens": 1})
        assert st == 200 and json.loads(body)["kvo"]["instance_id"] == "eng-b", (st, body)
        stats = json.loads(call(base + "/route/stats")[1])
        a = {i["instance_id"]: i for i in stats["instances"]}
        assert stats["retries"] == 1 and a["eng-a"]["unreachable"] == 1, stats
        # Nobody up: 503 in OpenAI's error shape.
        engines[1].stop()
        st, body = call(base + "/v1/completions", {"model": "m", "prompt": doc, "max_tokens": 1})
        err = json.loads(body)["error"]
        assert st == 503 and set(err) == {"message", "type", "param", "code"}, (st, body)
        assert call(base + "/health")[0] == 503
        metrics = call(base + "/metrics")[1]
        stats = json.loads(call(base + "/route/stats")[1])
        for inst in stats["instances"]:
            for name, key in (("decisions", "decisions"), ("predicted_hit_tokens", "predicted_hit_tokens"),
                              ("delivered_hit_tokens", "delivered_hit_tokens")):
                line = f'kvo_route_{name}_total{{instance="{inst["instance_id"]}"}} {float(inst[key])}'
                assert line in metrics, line + "\n" + metrics
        assert stats["unplaced"] == 1 and stats["requests"] == 10, stats
        for needle in ('kvo_route_decisions_total{instance="eng-a"}',
                       'kvo_route_predicted_hit_tokens_total{instance="eng-a"}',
                       'kvo_route_delivered_hit_tokens_total{instance="eng-b"}',
                       "kvo_route_retries_total 1.0", "kvo_route_unplaced_total 1.0",
                       "kvo_route_decision_seconds_bucket"):
            assert needle in metrics, needle + "\n" + metrics

        # round-robin over two fresh engines, --no-register: alternates whatever the prefix.
        e3, e4 = Engine("rr-1", 1, 2, 0), Engine("rr-2", 3, 4, 0)
        engines += [e3, e4]
        rr = start([kvo, "route", "--no-register", "--engine", e3.url, "--engine", e4.url,
                    "--policy", "round-robin", "--port", "0"], procs)
        got = [json.loads(call(rr["http"] + "/v1/completions", {"prompt": doc})[1])["kvo"]["instance_id"]
               for _ in range(4)]
        assert got == ["rr-1", "rr-2", "rr-1", "rr-2"], got

        # Bad flags and a port in use: usage errors naming them.
        bad = subprocess.run([kvo, "route", "--engine", e3.url, "--policy", "fastest"], capture_output=True,
                             text=True, timeout=20)
        assert bad.returncode != 0 and "--policy" in bad.stderr, bad.stderr
        bad = subprocess.run([kvo, "route", "--engine", e3.url, "--policy", "kv"], capture_output=True,
                             text=True, timeout=20)
        assert bad.returncode != 0 and "--indexer" in bad.stderr, bad.stderr
        bad = subprocess.run([kvo, "route", "--engine", e3.url, "--policy", "random", "--port", str(rr["port"])],
                             capture_output=True, text=True, timeout=20)
        assert bad.returncode != 0 and str(rr["port"]) in bad.stderr, bad.stderr
        for p in procs:
            p.terminate()
        for p in procs[-2:]:
            assert p.wait(timeout=10) == 0, f"{p.args[:3]} exit {p.returncode} on SIGTERM"
        print("ok")
        return 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        for e in engines:
            try:
                e.stop()
            except Exception:
                pass
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
