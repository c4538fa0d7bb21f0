"""Peak memory of one inference call, each contender in a fresh process.

CPU: the resident set (RSS). The child process imports its library, notes
its RSS, builds the model, then resets the kernel's high-water mark
(``/proc/self/clear_refs``) and runs one forward pass; the peak reported is
the high-water mark minus the RSS before the model was built, i.e. weights +
input + activations + allocator slack, without the libraries' import cost.
CUDA: ``torch.cuda.max_memory_allocated`` over the same call (weights
included).
"""
from __future__ import annotations

import ctypes
import gc
import json
import os
import subprocess
import sys
from typing import Any, Dict, List, Optional, Tuple

MIB = 2 ** 20


def _status_kib(field: str) -> Optional[int]:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _trim() -> None:
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _build(lib: str, model: str, overrides, dt, device: str, spec: Dict[str, Any], img_size=None):
    import torch

    from ..models.inference import prepare_inference
    from .models import build_model, model_config
    from .peers import build_peer, forward_fn

    label, cfg = model_config(model, img_size, overrides)
    base = build_model(cfg, 0)
    ctx = torch.autocast(device_type=device.split(":")[0], dtype=dt) \
        if lib != "vitkit" and dt != torch.float32 and spec.get("peer_bf16") == "autocast" else None
    if lib == "vitkit":
        fn = prepare_inference(base, dt, device=device)
    else:
        peer = build_peer(lib, base, copy_weights=False, check=False)
        del base
        module = peer.module.to(device)
        if dt != torch.float32 and ctx is None:
            module = module.to(dt)
        fn = forward_fn(lib, module)
    return fn, ctx, label, cfg


def _build_and_run(lib, model, overrides, batch, dt, device, spec, img_size=None) -> None:
    import torch

    from .models import example_batch

    fn, ctx, _, cfg = _build(lib, model, overrides, dt, device, spec, img_size)
    with torch.inference_mode():
        if ctx is not None:
            with ctx:
                fn(example_batch(cfg, batch, 0, device))
        else:
            fn(example_batch(cfg, batch, 0, device))
    del fn


def probe(spec: Dict[str, Any]) -> Dict[str, Any]:
    """Runs in the child: build one contender, run one forward pass, report memory in MiB."""
    import torch

    from ..models.inference import resolve_dtype
    from .models import example_batch

    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    lib, device = spec["library"], spec.get("device", "cpu")
    dt = resolve_dtype(spec["dtype"])
    if lib in ("onnxruntime", "openvino") and dt != torch.float32:
        return {"error": f"{lib} is measured in fp32 only here"}
    if lib != "vitkit":
        from .peers import peer_version

        if peer_version(lib) is None:
            return {"error": f"{lib} is not installed"}
    # Warm the library up on a tiny model first (lazy imports, kernel caches), so that the baseline below
    # excludes every one-time cost and only this model's memory is counted.
    _build_and_run(lib, spec["model"], {**(spec.get("overrides") or {}), "depth": 1}, 1, dt, device, spec,
                   img_size=spec.get("img_size"))
    cuda = device.startswith("cuda")
    _trim()
    rss0 = _status_kib("VmRSS")
    if cuda:
        torch.cuda.init()
        torch.cuda.reset_peak_memory_stats()
    fn, ctx, label, cfg = _build(lib, spec["model"], spec.get("overrides"), dt, device, spec, spec.get("img_size"))
    x = example_batch(cfg, spec["batch"], 0, device)
    _trim()
    rss1 = _status_kib("VmRSS")
    exact = _reset_peak()
    if cuda:
        torch.cuda.synchronize()
        before_gpu = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    with torch.inference_mode():
        if ctx is not None:
            with ctx:
                out = fn(x)
        else:
            out = fn(x)
    if cuda:
        torch.cuda.synchronize()
    hwm = _status_kib("VmHWM")
    res = {"library": lib, "model": label, "img_size": cfg.img_size[0], "batch": spec["batch"],
           "dtype": spec["dtype"], "device": device, "out_shape": list(out.shape),
           "rss_before_model_mib": rss0 / 1024 if rss0 else None,
           "model_and_input_mib": (rss1 - rss0) / 1024 if rss0 and rss1 else None,
           "hwm_exact": exact}
    if cuda:
        res["peak_mib"] = torch.cuda.max_memory_allocated() / MIB
        res["activations_mib"] = (torch.cuda.max_memory_allocated() - before_gpu) / MIB
        res["weights_and_input_mib"] = before_gpu / MIB
    elif hwm and rss0:
        res["peak_mib"] = (hwm - rss0) / 1024
        res["activations_mib"] = (hwm - rss1) / 1024 if exact else None
    return res


def measure(library: str, model: str, img_size: Optional[int], batch: int, dtype: str, *, device: str = "cpu",
            threads: Optional[int] = None, overrides: Optional[Dict[str, Any]] = None,
            peer_bf16: str = "weights", timeout: float = 1800) -> Dict[str, Any]:
    """Peak memory of one forward pass of ``batch`` images, measured in a fresh Python process."""
    spec = {"library": library, "model": model, "img_size": img_size, "batch": batch, "dtype": dtype,
            "device": device, "threads": threads, "overrides": overrides or {},
            "peer_bf16": peer_bf16}
    proc = subprocess.run([sys.executable, "-m", "vitkit.bench.memory", json.dumps(spec)], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"library": library, "error": f"the memory probe failed (exit {proc.returncode}): {' | '.join(tail)}"}
    return json.loads(lines[-1])


def run_memory(models: List[str], img_sizes: List[Optional[int]], batches: List[int], dtypes: List[str],
               libraries: List[str], *, device: str = "cpu", threads: Optional[int] = None,
               overrides: Optional[Dict[str, Any]] = None, peer_bf16: str = "weights",
               log=print) -> Tuple[List[dict], List[str]]:
    rows, notes = [], []
    for model in models:
        for img in img_sizes:
            for batch in batches:
                for dtype in dtypes:
                    for lib in ["vitkit", *libraries]:
                        r = measure(lib, model, img, batch, dtype, device=device, threads=threads,
                                    overrides=overrides, peer_bf16=peer_bf16)
                        if "error" in r:
                            note = f"memory {lib} skipped: {r['error']}"
                            if note not in notes:
                                notes.append(note)
                            log(f"  {note}")
                            continue
                        if not r.get("hwm_exact", True):
                            notes.append("the kernel refused to reset the RSS high-water mark: CPU peaks include "
                                         "model building")
                        r.update(kind="memory", library={"hf": "HF"}.get(lib, lib), compile=False)
                        rows.append(r)
                        log(f"memory: {r['model']} {r['img_size']}px batch {batch} {dtype} {r['library']:12s} "
                            f"peak {r['peak_mib']:8.1f} MiB (model+input {r['model_and_input_mib'] or 0:.1f})")
    return rows, notes


if __name__ == "__main__":
    import warnings

    warnings.simplefilter("ignore")
    print(json.dumps(probe(json.loads(sys.argv[1]))))
