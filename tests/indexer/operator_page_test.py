#!/usr/bin/env python3
"""The indexer's operator page (GET /) in headless Chromium against real processes.

A real publisher (`kvo events publish`, ZeroMQ PUB + replay) feeds `kvo index serve`; once the
index has applied every batch, Chromium loads the page (with ?q= so the page's query box runs a
prefix query), its rendered DOM is checked against GET /v1/sources, GET /v1/media and POST
/v1/score, and a screenshot is saved as an artifact (ARTIFACT_DIR/operator_page.png).
Skips (exit 77, ctest SKIP_RETURN_CODE) when Chromium is not installed.

usage: operator_page_test.py KVO_BINARY ARTIFACT_DIR
"""
import html.parser
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

SKIP = 77
DEADLINE_S = 20
BLOCK = 4


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as r:
        return r.status, r.headers.get("Content-Type", ""), r.read().decode()


class Cells(html.parser.HTMLParser):
    """Collects, per table id, the rows' data-* attributes and the data-k cells' text."""

    def __init__(self):
        super().__init__()
        self.tables = {}
        self.table = None
        self.row = None
        self.key = None
        self.body_attrs = {}

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "body":
            self.body_attrs = a
        if tag == "table":
            self.table = a.get("id")
            self.tables.setdefault(self.table, [])
        elif tag == "tr" and self.table and any(k.startswith("data-") for k in a):
            self.row = {k[5:]: v for k, v in a.items() if k.startswith("data-")}
            self.row["cells"] = {}
            self.tables[self.table].append(self.row)
        elif tag == "td" and self.row is not None and "data-k" in a:
            self.key = a["data-k"]
            self.row["cells"][self.key] = ""

    def handle_endtag(self, tag):
        if tag == "td":
            self.key = None
        elif tag == "tr":
            self.row = None
        elif tag == "table":
            self.table = None

    def handle_data(self, data):
        if self.key is not None:
            self.row["cells"][self.key] += data


def main():
    kvo, artifacts = sys.argv[1], sys.argv[2]
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        print("SKIP: chromium is not installed (scripts/deps.sh installs it)")
        return SKIP
    os.makedirs(artifacts, exist_ok=True)
    seed = int(os.environ.get("KVO_TEST_SEED", str(int(time.time()) % 100000)))
    print(f"seed {seed}")
    work = tempfile.mkdtemp(prefix="kvo-page-")
    procs = []
    try:
        pub, rep = free_port(), free_port()
        # Batches: stores on GPU, CPU and STORAGE of chained blocks of a document, one removal.
        tokens = [(seed * 7 + i) % 50000 + 1 for i in range(BLOCK * 6)]
        hashes = [seed * 1000 + i + 1 for i in range(6)]
        lines = []
        for i, medium in enumerate(["GPU", "GPU", "GPU", "CPU", "CPU", "STORAGE"]):
            lines.append({"ts": time.time(), "data_parallel_rank": 0, "events": [{
                "type": "BlockStored", "block_hashes": [hashes[i]],
                "parent_block_hash": hashes[i - 1] if i else None,
                "token_ids": tokens[i * BLOCK:(i + 1) * BLOCK], "block_size": BLOCK,
                "lora_id": None, "medium": medium, "lora_name": None, "extra_keys": None, "group_idx": 0, "kv_cache_spec_kind": "full_attention"}]})
        lines.append({"ts": time.time(), "data_parallel_rank": 0, "events": [{
            "type": "BlockRemoved", "block_hashes": [hashes[2]], "medium": "GPU", "group_idx": 0}]})
        batches = os.path.join(work, "batches.jsonl")
        with open(batches, "w") as f:
            f.write("\n".join(json.dumps(l) for l in lines) + "\n")
        cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{pub}",
               "replay_endpoint": f"tcp://127.0.0.1:{rep}", "topic": "kv"}
        procs.append(subprocess.Popen(
            [kvo, "events", "publish", "--kv-events-config", json.dumps(cfg), "--input", batches,
             "--linger-ms", str(DEADLINE_S * 1000)], stdout=subprocess.DEVNULL))
        idx = subprocess.Popen(
            [kvo, "index", "serve", "--db", os.path.join(work, "index.db"), "--http", "127.0.0.1:0",
             "--source", f"engine-a=tcp://127.0.0.1:{pub},replay=tcp://127.0.0.1:{rep},topic=kv"],
            stdout=subprocess.PIPE, text=True)
        procs.append(idx)
        ready = json.loads(idx.stdout.readline())
        base = ready["http"]
        deadline = time.monotonic() + DEADLINE_S
        while True:  # the index catches up by replay (late join): poll until it has every batch
            src = json.loads(get(base + "/v1/sources")[2])["sources"][0]
            if src["last_sequence"] is not None and src["last_sequence"] >= len(lines) - 1:
                break
            for proc in procs:
                assert proc.poll() is None, f"{proc.args[:3]} exited with {proc.returncode}"
            assert time.monotonic() < deadline, f"index never applied every batch: {src}"
            time.sleep(0.05)

        status, ctype, page = get(base + "/")
        assert status == 200 and ctype.startswith("text/html"), (status, ctype)
        assert "<script" in page and "http://" not in page.replace(base, ""), "page must be self-contained"

        query = ",".join(map(str, tokens))
        url = f"{base}/?q={query}&bs={BLOCK}"
        flags = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 f"--user-data-dir={os.path.join(work, 'chromium')}", "--window-size=1280,900",
                 "--virtual-time-budget=3000"]
        dom = subprocess.run(flags + ["--dump-dom", url], capture_output=True, text=True,
                             timeout=60).stdout
        shot = os.path.join(artifacts, "operator_page.png")
        subprocess.run(flags + [f"--screenshot={shot}", url], capture_output=True, timeout=60)
        assert os.path.getsize(shot) > 1000, "no screenshot"

        sources = json.loads(get(base + "/v1/sources")[2])["sources"]
        media = json.loads(get(base + "/v1/media")[2])["streams"]
        score = json.loads(get(base + "/v1/score", {"token_ids": tokens, "block_size": BLOCK})[2])
        p = Cells()
        p.feed(dom)
        assert p.body_attrs.get("data-refreshed"), "the page's script never refreshed:\n" + dom[:2000]
        rows = {r["source"]: r["cells"] for r in p.tables["sources"]}
        assert set(rows) == {s["name"] for s in sources}, (rows, sources)
        for s in sources:
            c = rows[s["name"]]
            assert c["connected"] == ("yes" if s["connected"] else "no"), (c, s)
            assert c["last_sequence"] == str(s["last_sequence"]), (c, s)
            assert c["gaps_filled"] == str(s["gaps_filled"]), (c, s)
            assert c["restarts_seen"] == str(s["restarts_seen"]), (c, s)
            assert c["hash_parity"] == s["hash_parity"]["state"], (c, s)
        assert sources[0]["last_sequence"] == len(lines) - 1
        mrows = {(r["source"], r["rank"]): r["cells"] for r in p.tables["media"]}
        for m in media:
            c = mrows[(m["source"], str(m["dp_rank"]))]
            for medium in ("GPU", "CPU", "STORAGE"):
                assert c[medium] == str(m["entries"].get(medium, 0)), (c, m)
        assert media[0]["entries"] == {"GPU": 2, "CPU": 2, "STORAGE": 1}, media
        assert p.body_attrs.get("data-queried") == "1", "the query box did not answer"
        qrows = {r["source"]: r["cells"] for r in p.tables["query"]}
        for i in score["instances"]:
            c = qrows[i["source"]]
            assert c["prefix_blocks"] == str(i["prefix_blocks"]), (c, i)
            assert c["prefix_tokens"] == str(i["prefix_tokens"]), (c, i)
        print(f"ok: page matches /v1/sources, /v1/media and /v1/score; screenshot {shot}")
        return 0
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
