"""Speed and memory, measured: vitkit side by side with timm, Hugging Face and torchvision.

>>> from vitkit.bench import run_bench, BenchOptions
>>> result = run_bench(["inference"], ["B/16"], batches=[16], dtypes=["fp32"])   # doctest: +SKIP

- :func:`run_bench`: inference throughput, latency (batch 1), training steps and peak memory, every
  contender with the same configuration, weights, input and threads, repeats alternated; tables, JSON
  and a Figure-12-style plot.
- :func:`roofline`: the least time the model's own GEMM shapes allow on this machine.
- :func:`vitkit.models.inference.prepare_inference`: the fast inference path being measured.
- :func:`machine_line`: the one line that says where a number was measured.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from ..errors import ConfigError, InputError
from ..models.inference import prepare_inference
from ..timing import Stats, alternate
from .machine import busy_warning, machine_info, machine_line, set_threads
from .memory import run_memory
from .peers import PEERS, PeerUnavailable, build_peer, parse_peers, peer_version
from .report import comparison_table, plot_figure12, rows_table, write_json
from .roofline import Gemm, Roofline, model_gemms, peak_gemm, roofline
from .runner import BenchOptions, compare, run_inference, run_training

KINDS = ("inference", "latency", "train", "memory", "roofline")


def run_bench(what: Sequence[str], models: Sequence[str], *, img_sizes: Sequence[Optional[int]] = (None,),
              batches: Sequence[int] = (16,), train_batches: Sequence[int] = (32,),
              memory_batches: Sequence[int] = (64,), dtypes: Sequence[str] = ("fp32",),
              compiles: Sequence[bool] = (False,), threads: Optional[int] = None,
              options: Optional[BenchOptions] = None, out: Optional[str] = None,
              command: Optional[str] = None) -> Dict[str, Any]:
    """Run the requested benchmarks and return {machine, rows, comparisons, notes, ...}.

    ``what``: some of inference, latency, train, memory, roofline. ``img_sizes``: None = the model's
    own. With ``out`` (a folder), writes ``bench.json`` and ``bench.png`` there.
    """
    opts = options or BenchOptions()
    _check_request(what, models, opts)
    set_threads(threads)
    info = machine_info(opts.device)
    opts.log(machine_line(info))
    rows: List[dict] = []
    notes: List[str] = []
    extra: Dict[str, Any] = {}
    if "inference" in what:
        r, n = run_inference(list(models), list(img_sizes), list(batches), list(dtypes), list(compiles), opts)
        rows += r
        notes += n
    if "latency" in what:
        r, n = run_inference(list(models), list(img_sizes), [1], list(dtypes), list(compiles), opts, kind="latency")
        rows += r
        notes += n
    if "train" in what:
        r, n = run_training(list(models), list(img_sizes), list(train_batches), list(dtypes), list(compiles), opts)
        rows += r
        notes += n
    if "memory" in what:
        r, n = run_memory(list(models), list(img_sizes), list(memory_batches), list(dtypes), list(opts.peers),
                          device=opts.device, threads=threads, overrides=opts.overrides,
                          peer_bf16=opts.peer_bf16, log=opts.log)
        rows += r
        notes += n
    if "roofline" in what:
        extra["roofline"] = _roofline_only(models, img_sizes, batches, dtypes, opts)
    notes = list(dict.fromkeys(notes))
    after = machine_info(opts.device)
    info["load_avg_after"] = after.get("load_avg")
    info["paths"] = after["paths"]  # the kernels the runs chose (the first call that needs one measures it)
    warn = busy_warning(after)
    if warn:
        notes.append(warn)
    comps = compare(rows)
    result = {"machine": info, "machine_line": machine_line(info), "command": command, "rows": rows,
              "comparisons": comps, "notes": notes, **extra}
    if out:
        _write(Path(out), result, opts, extra)
    return result


def _check_request(what: Sequence[str], models: Sequence[str], opts: BenchOptions) -> None:
    """ConfigError / InputError for an unknown benchmark, no model, or a CUDA device torch does not see."""
    bad = [w for w in what if w not in KINDS]
    if bad:
        raise ConfigError(f"unknown benchmark(s) {bad}: choose from {', '.join(KINDS)}")
    if not models:
        raise InputError("name at least one model, e.g. B/16")
    if opts.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("--device cuda was asked for but torch sees no CUDA device")


def _write(folder: Path, result: Dict[str, Any], opts: BenchOptions, extra: Dict[str, Any]) -> None:
    """bench.json and bench.png of ``result`` into ``folder``; their paths go into ``result``."""
    write_json(folder / "bench.json", result["machine"], opts.to_dict(), result["rows"], result["comparisons"],
               result["notes"], result["command"], {"machine_line": result["machine_line"], **extra})
    result["json"] = str(folder / "bench.json")
    png = plot_figure12(result["rows"], folder / "bench.png", title=result["machine_line"])
    if png:
        result["png"] = str(png)


def _roofline_only(models, img_sizes, batches, dtypes, opts: BenchOptions) -> List[dict]:
    from .models import model_config

    out = []
    for spec in models:
        for img in img_sizes:
            label, cfg = model_config(spec, img, opts.overrides)
            for dtype in dtypes:
                for batch in batches:
                    b = roofline(cfg, batch, dtype, opts.device, progress=lambda m: opts.log(f"  roofline: {m}"))
                    d = {"model": label, "img_size": cfg.img_size[0], **b.to_dict()}
                    opts.log(f"roofline: {label} {cfg.img_size[0]}px batch {batch} {dtype}: "
                             f"{b.images_per_s:.2f} img/s at most ({d['effective_gflops_per_s']:.1f} GFLOP/s over "
                             f"{b.gflop_per_image:.2f} GFLOP/image)")
                    out.append(d)
    return out


def format_result(result: Dict[str, Any]) -> str:
    """The printed report: machine line, comparison table, every row, notes."""
    parts = [result["machine_line"]]
    if result["comparisons"]:
        parts += ["", comparison_table(result["comparisons"])]
    if result["rows"]:
        parts += ["", rows_table(result["rows"])]
    for r in result.get("roofline", []):
        parts.append(f"roofline {r['model']} {r['img_size']}px batch {r['batch']} {r['dtype']}: "
                     f"{r['roofline_images_per_s']:.2f} img/s ({r['effective_gflops_per_s']:.1f} GFLOP/s)")
    for n in result["notes"]:
        parts.append(f"note: {n}")
    return "\n".join(parts)


__all__ = [
    "BenchOptions", "Gemm", "KINDS", "PEERS", "PeerUnavailable", "Roofline", "Stats", "alternate",
    "build_peer", "busy_warning", "compare", "comparison_table", "format_result", "machine_info", "machine_line",
    "model_gemms", "parse_peers", "peak_gemm", "peer_version", "plot_figure12", "prepare_inference", "roofline",
    "rows_table", "run_bench", "run_inference", "run_memory", "run_training", "set_threads", "write_json",
]
