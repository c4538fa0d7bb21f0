"""Load test of ``vitkit serve`` on loopback: C concurrent clients, each sending N requests of one image, one at
a time; throughput, latency percentiles, errors and the batch sizes the server formed, against the offline
throughput of the same engine at the achieved batch size, measured in the same run once the server is gone.

It starts the server itself (``vitkit serve`` in a subprocess on 127.0.0.1 and a free port, or ``--url`` for
one already running), and every loop is bounded in count and time. The steps, in order:

1. idle latency: ``--idle`` sequential single requests on the idle server (median), against the engine's
   direct call at batch 1 (measured in step 4);
2. the load: C clients x N requests (async httpx), with a wall-clock cap (``--max-seconds``);
3. the server's peak memory (VmHWM), then SIGTERM (it must drain and exit 0);
4. offline, in this process: the same engine and dtype (``vitkit.serve.engines``) at the achieved batch size
   and at batch 1, and the peak memory of a process that only holds the model and runs one batch;
5. the verdicts against the targets of docs/serving.md, written to
   ``benchmarks/results/<kind>/serve/<name>.json`` with the machine line.

The ViT-B/16 measurement of docs/serving.md (on a quiet machine)::

    .venv/bin/python benchmarks/serve_load.py --model B/16 --clients 32 --requests 63 \\
        --engine auto --max-batch 16 --max-wait-ms 5

A quick check (a few seconds)::

    .venv/bin/python benchmarks/serve_load.py --model Ti/16 --img-size 64 --clients 4 --requests 10 --name quick
"""
from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import kind_folder, main_guard  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rss_mb(pid: int, field: str = "VmRSS") -> Optional[float]:
    """A process's resident memory now (VmRSS) or at its peak (VmHWM), in MB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _image(size: int) -> bytes:
    """A photo (scikit-image's chelsea) as JPEG, else a synthetic one."""
    from PIL import Image
    try:
        from skimage import data
        img = Image.fromarray(data.chelsea())
    except ImportError:
        rng = np.random.default_rng(0)
        img = Image.fromarray(rng.integers(0, 256, (300, 451, 3), dtype=np.uint8))
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def _random_checkpoint(name: str, img_size: Optional[int], folder: Path) -> Path:
    """A randomly initialised model (throughput does not depend on the weights) with ImageNet labels and the
    torchvision preset, saved as a vitkit checkpoint."""
    import torch

    import vitkit
    from vitkit.checkpoints import save_model
    from vitkit.data.preprocess import get_preset, imagenet_classes

    torch.manual_seed(0)
    kw = {"img_size": img_size} if img_size else {}
    model = vitkit.create_model(name, num_classes=1000, **kw)
    with torch.no_grad():
        model.head.weight.normal_(std=0.02)
    return save_model(model, folder / "model", labels=imagenet_classes(),
                      preprocessing=get_preset("torchvision", model.config.img_size))


def _percentiles(xs: List[float]) -> Dict[str, float]:
    if not xs:
        return {}
    a = np.asarray(xs) * 1e3
    return {"p50_ms": float(np.percentile(a, 50)), "p95_ms": float(np.percentile(a, 95)),
            "p99_ms": float(np.percentile(a, 99)), "max_ms": float(a.max()), "mean_ms": float(a.mean())}


async def _load(url: str, body: bytes, clients: int, requests: int, max_seconds: float, token: Optional[str]):
    import httpx

    headers = {"Content-Type": "image/jpeg"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    latencies: List[float] = []
    errors: Dict[str, int] = {}
    batches: Dict[int, int] = {}  # batch id -> size
    deadline = time.perf_counter() + max_seconds
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)

    async def client(http):
        for _ in range(requests):
            if time.perf_counter() > deadline:
                errors["not sent (time cap)"] = errors.get("not sent (time cap)", 0) + 1
                continue
            t0 = time.perf_counter()
            try:
                r = await http.post(url + "/v1/classify?topk=1", content=body, headers=headers)
            except httpx.HTTPError as err:
                errors[type(err).__name__] = errors.get(type(err).__name__, 0) + 1
                continue
            took = time.perf_counter() - t0
            if r.status_code != 200:
                key = f"HTTP {r.status_code}"
                errors[key] = errors.get(key, 0) + 1
                continue
            latencies.append(took)
            b = r.json()["results"][0]["batch"]
            batches[b["id"]] = b["size"]

    async with httpx.AsyncClient(limits=limits, timeout=120) as http:
        t0 = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        wall = time.perf_counter() - t0
    return latencies, errors, batches, wall


def _idle(url: str, body: bytes, n: int, token: Optional[str]) -> List[float]:
    import httpx

    headers = {"Content-Type": "image/jpeg", **({"Authorization": f"Bearer {token}"} if token else {})}
    out = []
    with httpx.Client(timeout=60) as http:
        for _ in range(n):
            t0 = time.perf_counter()
            r = http.post(url + "/v1/classify?topk=1", content=body, headers=headers)
            if r.status_code == 200:
                out.append(time.perf_counter() - t0)
            time.sleep(0.05)  # idle between requests
    return out


def _held_model_rss(weights: str, batch: int, dtype: str, engine: str, img_size: Optional[int]) -> Optional[float]:
    """Peak memory (VmHWM) of a process that holds the model (in the served engine) and runs one batch."""
    code = (
        "import sys, torch\n"
        "from vitkit.serve.app import load_model\n"
        "from vitkit.serve.engines import build_engine, reference_batch\n"
        f"m = load_model({weights!r}, img_size={img_size!r})\n"
        f"e = build_engine({engine!r}, m, {dtype!r})\n"
        f"e.run(reference_batch(m, {batch}))\n"
        "print([l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1])\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    try:
        return int(r.stdout.strip().splitlines()[-1]) / 1024
    except (ValueError, IndexError):
        print(r.stderr[-2000:], file=sys.stderr)
        return None


def _offline(weights: str, engine: str, dtype: str, batch: int, img_size: Optional[int], seconds: float):
    """The same engine, in this process, at ``batch`` and at batch 1: images/s and the median call time."""
    import torch

    from vitkit.serve.app import load_model
    from vitkit.serve.engines import build_engine, reference_batch, time_engine

    model = load_model(weights, img_size=img_size)
    eng = build_engine(engine, model, dtype)
    at_batch = time_engine(eng, reference_batch(model, batch), budget_s=seconds, min_runs=3)
    at_one = time_engine(eng, reference_batch(model, 1), budget_s=seconds / 2, min_runs=5)
    eng.close()
    return {"engine": engine, "dtype": dtype, "threads": torch.get_num_threads(), "at_batch": at_batch,
            "batch_1": at_one}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group()
    src.add_argument("--weights", help="a checkpoint vitkit reads")
    src.add_argument("--model", help="a model name (B/16, Ti/16, ...) with random weights")
    p.add_argument("--url", help="a server already running (no memory or SIGTERM steps; the offline step runs "
                   "when --weights or --model names the same model)")
    p.add_argument("--img-size", type=int)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--requests", type=int, default=63, help="per client (32 x 63 = 2,016)")
    p.add_argument("--max-seconds", type=float, default=900, help="cap on the load's wall clock")
    p.add_argument("--idle", type=int, default=20, help="sequential requests on the idle server")
    p.add_argument("--engine", default="auto")
    p.add_argument("--dtype", default="fp32")
    p.add_argument("--max-batch", type=int, default=16)
    p.add_argument("--max-wait-ms", type=float, default=5.0)
    p.add_argument("--offline-seconds", type=float, default=10.0)
    p.add_argument("--name", help="result file name (default: from the model and settings)")
    p.add_argument("--out", help="folder for the JSON (default benchmarks/results/<kind>/serve)")
    args = p.parse_args()
    if not (args.weights or args.model or args.url):
        p.error("give --weights, --model or --url")
    if args.clients < 1 or args.requests < 1 or args.clients * args.requests > 20_000:
        p.error("--clients x --requests must be between 1 and 20,000")

    from vitkit.bench import machine_line
    from vitkit.utils import write_json_atomic

    tmp = tempfile.TemporaryDirectory(prefix="vitkit-serve-load-")
    weights = args.weights
    if args.model:
        weights = str(_random_checkpoint(args.model, args.img_size, Path(tmp.name)))
    body = _image(224)
    token = os.environ.get("VITKIT_SERVE_TOKEN")
    proc = None
    log_path = Path(tmp.name) / "server.log"
    result: Dict[str, Any] = {"command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
                              "machine": machine_line(), "clients": args.clients, "requests_per_client": args.requests,
                              "image_bytes": len(body)}
    try:
        if args.url:
            url = args.url.rstrip("/")
        else:
            port = _free_port()
            url = f"http://127.0.0.1:{port}"
            cmd = [sys.executable, "-m", "vitkit", "serve", weights, "--port", str(port), "--engine", args.engine,
                   "--dtype", args.dtype, "--max-batch", str(args.max_batch), "--max-wait-ms", str(args.max_wait_ms),
                   "--max-queue", str(max(256, 2 * args.clients))]
            if args.img_size:
                cmd += ["--img-size", str(args.img_size)]
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(log_path, "w"))
        import httpx
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc is not None and proc.poll() is not None:
                raise SystemExit(f"the server exited ({proc.returncode}):\n{log_path.read_text()[-3000:]}")
            time.sleep(0.2)
        else:
            raise SystemExit("the server did not get ready in 10 minutes")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        info = httpx.get(url + "/v1/model", headers=headers, timeout=10).json()
        engine, dtype = info["engine"]["name"], info["engine"]["dtype"]
        result["server"] = {"model": info["id"], "engine": engine, "dtype": dtype,
                            "engine_selection": info.get("engine_selection"), "options": info.get("options")}
        print(f"server: {info['id']} on {engine} ({dtype}), max batch {args.max_batch}, max wait {args.max_wait_ms} ms",
              file=sys.stderr)

        idle = _idle(url, body, args.idle, token) if args.idle else []
        result["idle"] = {"requests": len(idle), **_percentiles(idle)}
        print(f"idle: median {result['idle'].get('p50_ms', float('nan')):.1f} ms over {len(idle)} requests",
              file=sys.stderr)

        lat, errors, batches, wall = asyncio.run(_load(url, body, args.clients, args.requests, args.max_seconds, token))
        sizes = list(batches.values())
        n_ok = len(lat)
        result["load"] = {"ok": n_ok, "errors": errors, "error_count": sum(errors.values()), "wall_s": wall,
                          "throughput_img_s": n_ok / wall if wall else 0.0, **_percentiles(lat),
                          "batches": len(sizes), "batch_size_mean": float(np.mean(sizes)) if sizes else 0.0,
                          "batch_size_hist": {str(k): sizes.count(k) for k in sorted(set(sizes))}}
        print(f"load: {n_ok} ok, {sum(errors.values())} errors in {wall:.1f} s = "
              f"{result['load']['throughput_img_s']:.1f} img/s; p50 {result['load'].get('p50_ms', 0):.0f} / p99 "
              f"{result['load'].get('p99_ms', 0):.0f} ms; mean batch {result['load']['batch_size_mean']:.1f}",
              file=sys.stderr)
        if proc is not None:
            result["server_rss_mb"] = _rss_mb(proc.pid)  # after the load, before the drain
            result["server_peak_rss_mb"] = _rss_mb(proc.pid, "VmHWM")  # with --engine auto: during the selection
            proc.send_signal(signal.SIGTERM)
            result["server_exit_code_after_sigterm"] = proc.wait(timeout=120)
            proc = None
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    if weights:  # the server is gone: the cores are the offline measurement's
        achieved = max(1, int(round(result["load"]["batch_size_mean"])))
        off = _offline(weights, engine, dtype, achieved, args.img_size, args.offline_seconds)
        result["offline"] = off
        held = _held_model_rss(weights, achieved, dtype, engine, args.img_size)
        result["held_model_peak_rss_mb"] = held
        served = result["load"]["throughput_img_s"]
        batch_s = off["at_batch"]["median_s"]
        fastest = max((c.get("img_per_s", 0.0) for c in (result["server"]["engine_selection"] or {}).get(
            "candidates", [])), default=None)
        verdict = {
            "served_over_offline": served / off["at_batch"]["img_per_s"],
            "served_over_offline_target": 0.90,
            "errors": result["load"]["error_count"], "requests": args.clients * args.requests,
            "p99_ms": result["load"].get("p99_ms"),
            "p99_bound_ms": args.max_wait_ms + 2 * batch_s * 1e3,
            # a closed loop (each client sends its next request when the last one returns) has a mean latency of
            # clients / throughput (Little's law): with clients = 2 x max-batch and the served rate equal to the
            # offline one, that mean is the p99 bound less max-wait, so the p99 sits above it by the spread
            "mean_ms": result["load"].get("mean_ms"),
            "closed_loop_mean_ms": (args.clients * 1e3 / served) if served else None,
            "idle_p50_ms": result["idle"].get("p50_ms"),
            "idle_bound_ms": off["batch_1"]["median_s"] * 1e3 + 5.0,
        }
        if fastest and args.engine == "auto":
            # the selection timed every engine at --max-batch; the served engine at the achieved batch size
            verdict["auto_served_over_fastest_at_max_batch"] = served / fastest
        if result.get("server_rss_mb") and held:
            verdict["rss_ratio"] = result["server_rss_mb"] / held
            verdict["rss_ratio_target"] = 1.3
        verdict["met"] = {
            "throughput": verdict["served_over_offline"] >= 0.90,
            "no_errors": verdict["errors"] == 0,
            "p99": verdict["p99_ms"] is not None and verdict["p99_ms"] <= verdict["p99_bound_ms"],
            "idle_latency": verdict["idle_p50_ms"] is not None and verdict["idle_p50_ms"] <= verdict["idle_bound_ms"],
            **({"rss": verdict["rss_ratio"] <= 1.3} if "rss_ratio" in verdict else {}),
        }
        result["verdict"] = verdict
        print(json.dumps(verdict, indent=1), file=sys.stderr)
    name = args.name or (f"{(args.model or Path(weights or 'server').name).replace('/', '')}-{args.engine}-{args.dtype}"
                         f"-c{args.clients}-b{args.max_batch}")
    out = Path(args.out) if args.out else kind_folder() / "serve"
    path = out / f"{name}.json"
    write_json_atomic(path, result)
    print(f"wrote {path}")
    tmp.cleanup()


if __name__ == "__main__":
    main_guard(main)
