"""Load on `tfcompile serve`: the server on loopback, driven by N concurrent async clients (httpx),
against the same requests sent one at a time, in one run.

Builds a text classifier (specs/sst2-finetune.yaml from scratch) and the char decoder
(specs/shakespeare-char.yaml), each trained one step (speed does not depend on the weights), or
takes bundles you give; starts `tfcompile serve` on them in a subprocess, then measures:

- classifier: requests/s and latency percentiles one at a time, then with --clients concurrent
  clients (each a loop of requests), each phase bounded by --seconds and --requests;
- decoder: tokens/s of one completion stream at a time, then of --streams concurrent streams;
  then 8-token completions one at a time, alone and while another client keeps a --long-tokens
  completion running (they join its batch between its steps);
- server overhead at batch 1: a /v1/classify request's median latency minus the median of the same
  call on tfcompile.runtime directly, in this process, the two in alternating rounds.

    python benchmarks/serve_load.py                      # writes benchmarks/results/serve_load-cpu.md
    python benchmarks/serve_load.py --classifier exported/sst2 --decoder exported/shakespeare-char
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch
from common import ROOT, device_name, trained, write_results

from tfcompile.runtime import SessionOptions, load

SHARED = ROOT.parent / "shared" / "data"
ONE_STEP = ["train.steps=1", "train.batch_size=8", "train.eval_interval=1", "train.eval_batches=1"]
TEXTS = [
    "a gorgeous, witty, seductive movie.",
    "the plot is thin, the acting wooden, and the running time interminable.",
    "it's a charming and often affecting journey.",
    "unflinchingly bleak and desperate",
    "the film is strictly routine.",
    "an utterly compelling `who wrote it' in which the reputation of the most famous author "
    "who ever lived comes into question.",
]
SHORT = 8  # tokens of the completions measured beside a long one
PROMPTS = ["ROMEO:", "First Citizen:\nBefore we proceed", "JULIET:\nO", "KING RICHARD III:\nNow is the"]


def build(spec: str, out: Path, overrides: list[str]) -> Path:
    from tfcompile.export import Source, export_bundle

    export_bundle(None, Source(run=trained(spec, out, [*overrides, *ONE_STEP])), out / "bundle")
    return out / "bundle"


@dataclass
class Phase:
    """What one phase measured: each request's latency, its tokens, and the wall time."""

    latencies: list[float] = field(default_factory=list)
    tokens: int = 0
    errors: dict[int, int] = field(default_factory=dict)
    seconds: float = 0.0
    server_cpu: float = float("nan")  # CPU seconds the server process spent (all its threads)
    client_cpu: float = 0.0  # CPU seconds this process, the clients, spent

    def percentile(self, q: float) -> float:
        return 1000 * float(np.percentile(self.latencies, q)) if self.latencies else float("nan")


def cpu_seconds(pid: int) -> float:
    """A process's user and system CPU time (Linux's /proc; NaN elsewhere)."""
    stat = Path(f"/proc/{pid}/stat")
    if not stat.exists():
        return float("nan")
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(
    server: int,
    url: str,
    clients: int,
    seconds: float,
    requests: int,
    body: dict,
    route: str,
    beside: dict | None = None,
) -> Phase:
    """One phase of ``drive``, with the CPU time the server and the clients spent on it."""
    server_before, client_before = cpu_seconds(server), time.process_time()
    phase = asyncio.run(drive(url, clients, seconds, requests, body, route, beside))
    phase.server_cpu = cpu_seconds(server) - server_before
    phase.client_cpu = time.process_time() - client_before
    return phase


async def drive(
    url: str, clients: int, seconds: float, requests: int, body: dict, route: str, beside: dict | None = None
) -> Phase:
    """``clients`` concurrent clients, each an httpx.AsyncClient with its own connection, sending
    ``body`` in a loop until ``seconds`` or ``requests`` in all. (One AsyncClient shared by many
    tasks spends more CPU in its connection pool than this server spends on a request.) With
    ``beside``, one more client sends that body in a loop all the while (a long completion)."""
    phase, sent = Phase(), 0

    async def background() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=None) as client:
            while True:
                await client.post(route, json=beside)

    running = asyncio.create_task(background()) if beside is not None else None
    await asyncio.sleep(0.5 if beside is not None else 0)  # the long completion has started
    deadline = time.perf_counter() + seconds

    async def loop(k: int) -> None:
        nonlocal sent
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            while time.perf_counter() < deadline and sent < requests:
                sent += 1
                request = {**body}
                if "texts" in request:
                    request["texts"] = [TEXTS[(sent + k) % len(TEXTS)]]
                start = time.perf_counter()
                r = await client.post(route, json=request)
                if r.status_code != 200:
                    phase.errors[r.status_code] = phase.errors.get(r.status_code, 0) + 1
                    continue
                phase.latencies.append(time.perf_counter() - start)
                if "prompt" in body:
                    phase.tokens += r.json()["usage"]["completion_tokens"]

    start = time.perf_counter()
    await asyncio.gather(*(loop(k) for k in range(clients)))
    phase.seconds = time.perf_counter() - start
    if running is not None:  # its client goes away: the server ends the completion
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
    return phase


def round_trips(url: str, body: dict, route: str, count: int) -> list[float]:
    """``count`` requests on one keep-alive connection of http.client, the lightest client there
    is, so that the time is the server's: each request's latency in seconds."""
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port))
    payload, headers = json.dumps(body), {"Content-Type": "application/json"}
    times = []
    for _ in range(count):
        start = time.perf_counter()
        connection.request("POST", route, payload, headers)
        response = connection.getresponse()
        response.read()
        times.append(time.perf_counter() - start)
        assert response.status == 200, response.status
    connection.close()
    return times


def overhead(
    runtime: Any, url: str, texts: list[str], rounds: int = 10, count: int = 50
) -> tuple[list[float], list[float]]:
    """A /v1/classify request's latencies and the same call's on ``runtime`` in this process, in
    alternating rounds (the idle server takes no CPU meanwhile), so that a machine whose speed
    drifts during the run moves both alike."""
    body = {"model": "clf", "texts": texts}
    round_trips(url, body, "/v1/classify", count)
    runtime.classify(texts)
    served, direct = [], []
    for _ in range(rounds):
        served += round_trips(url, body, "/v1/classify", count)
        for _ in range(count):
            start = time.perf_counter()
            runtime.classify(texts)
            direct.append(time.perf_counter() - start)
    return served, direct


def start_server(bundles: dict[str, Path], log: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as probe:  # a free loopback port
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "tfcompile", "serve", *(f"{n}={p}" for n, p in bundles.items())]
    command += [
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--max-batch-size",
        "64",
        "--max-queue",
        "1024",
    ]
    with log.open("w") as out:
        server = subprocess.Popen(command, stderr=out, env={**os.environ, "PYTHONPATH": str(ROOT)})
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"{url}/health").json()["ready"]:
                return server, url
        except httpx.TransportError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the server did not start:\n{log.read_text()}")
        time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--classifier", type=Path, help="a text classifier bundle (default: build one)")
    parser.add_argument("--decoder", type=Path, help="a decoder bundle (default: build one)")
    parser.add_argument("--clients", type=int, default=32, help="concurrent classifier clients")
    parser.add_argument("--streams", type=int, default=8, help="concurrent completion streams")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per completion")
    parser.add_argument(
        "--long-tokens",
        type=int,
        default=200,
        help=f"tokens of the long completion beside {SHORT}-token ones",
    )
    parser.add_argument("--seconds", type=float, default=20, help="time limit of each phase")
    parser.add_argument("--requests", type=int, default=2000, help="request limit of each phase")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        classifier = args.classifier or build(
            "sst2-finetune.yaml",
            Path(tmp) / "sst2",
            ["train.init_from=null", f"data.path={SHARED / 'sst2' / 'dev.tsv.gz'}", "data.val_path=null"],
        )
        decoder = args.decoder or build("shakespeare-char.yaml", Path(tmp) / "char", [])
        server, url = start_server({"clf": classifier, "lm": decoder}, Path(tmp) / "server.log")
        try:
            clf_body = {"model": "clf", "texts": [TEXTS[0]]}
            lm_body = {"model": "lm", "prompt": PROMPTS[0], "max_tokens": args.max_tokens, "temperature": 0}
            short = {**lm_body, "max_tokens": SHORT}
            long = {**lm_body, "prompt": PROMPTS[1], "max_tokens": args.long_tokens}
            runs: dict[str, tuple[int, dict, str, dict | None]] = {
                "clf one": (1, clf_body, "/v1/classify", None),
                "clf many": (args.clients, clf_body, "/v1/classify", None),
                "lm one": (1, lm_body, "/v1/completions", None),
                "lm many": (args.streams, lm_body, "/v1/completions", None),
                "short": (1, short, "/v1/completions", None),
                "short beside": (1, short, "/v1/completions", long),
            }
            for clients, body, route, _ in runs.values():  # warm the server and the connections
                asyncio.run(drive(url, clients, 2, 2 * clients, body, route))
            phases = {
                name: measure(server.pid, url, c, args.seconds, args.requests, b, r, beside)
                for name, (c, b, r, beside) in runs.items()
            }
            runtime = load(classifier, providers=["CPUExecutionProvider"], options=SessionOptions(spin=False))
            served, direct = overhead(runtime, url, [TEXTS[0]])
        finally:
            server.terminate()
            server.wait(30)

    def row(name: str, p: Phase, clients: int, unit: str) -> str:
        count = p.tokens if unit == "tokens/s" else len(p.latencies)
        errors = ", ".join(f"{n} x {code}" for code, n in sorted(p.errors.items())) or "none"
        answered = max(1, len(p.latencies))
        return (
            f"| {name} | {clients} | {len(p.latencies):,} | {count / p.seconds:,.1f} {unit} | "
            f"{p.percentile(50):,.1f} | {p.percentile(95):,.1f} | {p.percentile(99):,.1f} | "
            f"{1000 * p.server_cpu / answered:.2f} | {1000 * p.client_cpu / answered:.2f} | {errors} |"
        )

    clf_gain = (len(phases["clf many"].latencies) / phases["clf many"].seconds) / (
        len(phases["clf one"].latencies) / phases["clf one"].seconds
    )
    # What both cores could give the 32 clients were they never idle: the server's and the clients'
    # CPU per request at that load, spread over every core (the clients run on this machine too).
    many = phases["clf many"]
    cpu_ms = 1000 * (many.server_cpu + many.client_cpu) / max(1, len(many.latencies))
    cores = os.cpu_count() or 1
    clf_bound = (1000 * cores / cpu_ms) / (len(phases["clf one"].latencies) / phases["clf one"].seconds)
    lm_gain = (phases["lm many"].tokens / phases["lm many"].seconds) / (
        phases["lm one"].tokens / phases["lm one"].seconds
    )
    direct_ms, served_ms = 1000 * statistics.median(direct), 1000 * statistics.median(served)
    lines = [
        f"loopback HTTP, clients in one asyncio process beside the server; classifier {classifier.name} "
        f"({runtime.vocab_size:,}-token vocabulary), decoder {decoder.name}, {args.max_tokens} tokens "
        f"per completion; each phase at most {args.seconds:g} s and {args.requests:,} requests",
        "",
        "| workload | clients | requests | throughput | p50 ms | p95 ms | p99 ms | server CPU ms/request "
        "| client CPU ms/request | errors |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        row("classify, one at a time", phases["clf one"], 1, "requests/s"),
        row(f"classify, {args.clients} concurrent", phases["clf many"], args.clients, "requests/s"),
        row("completions, one stream at a time", phases["lm one"], 1, "tokens/s"),
        row(f"completions, {args.streams} concurrent", phases["lm many"], args.streams, "tokens/s"),
        row(f"{SHORT}-token completions, one at a time", phases["short"], 1, "requests/s"),
        row(
            f"{SHORT}-token completions, beside a {args.long_tokens}-token one",
            phases["short beside"],
            1,
            "requests/s",
        ),
        "",
        "| goal | measured |",
        "| --- | ---: |",
        f"| classifier requests/s, {args.clients} concurrent / one (goal >= 3x) | {clf_gain:.2f}x |",
        f"| the same at best, with all {cores} cores busy: {cores} / ({cpu_ms:.2f} ms of server and client "
        f"CPU per request) / the one-at-a-time rate | {clf_bound:.2f}x |",
        f"| decoder tokens/s, {args.streams} streams / one (goal >= 2x) | {lm_gain:.2f}x |",
        f"| {SHORT}-token completion p50 beside a {args.long_tokens}-token completion / alone "
        f"({phases['short beside'].percentile(50):.1f} ms / {phases['short'].percentile(50):.1f} ms) | "
        f"{phases['short beside'].percentile(50) / phases['short'].percentile(50):.2f}x |",
        f"| server overhead at batch 1: /v1/classify p50 {served_ms:.2f} ms (http.client, keep-alive) "
        f"- runtime.classify p50 {direct_ms:.2f} ms (goal <= 2 ms) | {served_ms - direct_ms:.2f} ms |",
    ]
    device = f"{device_name(torch.device('cpu'))}, {os.cpu_count()} cores"
    write_results("serve_load-cpu", "\n".join(lines), device)


if __name__ == "__main__":
    main()
