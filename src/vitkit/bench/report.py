"""Results as people read them: tables, a JSON file, and a Figure-12-style plot."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any, Dict, List, Optional

from ..utils import atomic_path, write_json_atomic

LIB_ORDER = ("vitkit", "vitkit-module", "timm", "HF", "torchvision", "ORT", "OpenVINO")


def _lib_key(lib: str) -> int:
    return LIB_ORDER.index(lib) if lib in LIB_ORDER else len(LIB_ORDER)


def _fmt_table(header: List[str], body: List[List[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [header] + body) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).rjust(w) if j else str(c).ljust(w)  # noqa: E731
                               for j, (c, w) in enumerate(zip(r, widths)))
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in body])


def rows_table(rows: List[dict]) -> str:
    """Every measurement, one line each."""
    body = []
    for r in rows:
        if r["kind"] == "memory":
            body.append([r["kind"], r["model"], r["img_size"], r["batch"], r["dtype"], "-", r["library"],
                         "-", "-", "-", f"{r['peak_mib']:.0f} MiB", "-"])
            continue
        frac = r.get("roofline_fraction")
        extra = f"{frac:.0%}" if frac is not None else "-"
        if "mfu" in r:
            extra += f" / MFU {r['mfu']:.1%}"
        body.append([r["kind"], r["model"], r["img_size"], r["batch"], r["dtype"], "yes" if r["compile"] else "no",
                     r["library"], f"{r['images_per_s']:.2f}", f"{r['ms_per_batch']:.1f}", f"{r['spread']:.1%}",
                     "-", extra])
    return _fmt_table(["kind", "model", "px", "batch", "dtype", "compile", "library", "img/s", "ms/batch",
                       "spread", "peak mem", "roofline"], body)


def comparison_table(comps: List[dict]) -> str:
    """vitkit against each peer at each one's best batch size, with the ratio to the best peer."""
    libs = sorted({lib for c in comps for lib in c["libraries"]}, key=_lib_key)
    body = []
    for c in comps:
        cells = []
        for lib in libs:
            v = c["libraries"].get(lib)
            if v is None:
                cells.append("-")
            elif c["kind"] == "memory":
                cells.append(f"{v['peak_mib']:.0f} MiB")
            elif c["kind"] == "latency":
                cells.append(f"{v['ms_per_batch']:.1f} ms")
            else:
                cells.append(f"{v['images_per_s']:.2f} (b{v['batch']})")
        ratio = c.get("ratio")
        if ratio is None:
            rtxt = "-"
        elif c["kind"] == "memory":
            rtxt = f"{ratio:.2f}x of {c['best_peer']} (lower is better)"
        else:
            rtxt = f"{ratio:.2f}x {c['best_peer']}"
        roof = f"{c['roofline_fraction']:.0%}" if "roofline_fraction" in c else "-"
        if "mfu" in c:
            roof += f" / MFU {c['mfu']:.1%}"
        body.append([c["kind"], c["model"], c["img_size"], c["dtype"], "yes" if c["compile"] else "no", *cells,
                     rtxt, roof])
    return _fmt_table(["kind", "model", "px", "dtype", "compile", *libs, "vitkit / best peer", "roofline"], body)


def write_json(path, machine: Dict[str, Any], options: Dict[str, Any], rows: List[dict], comps: List[dict],
               notes: List[str], command: Optional[str] = None, extra: Optional[Dict[str, Any]] = None) -> Path:
    obj = {"machine": machine, "command": command, "options": options, "notes": notes, "comparisons": comps,
           "rows": rows, **(extra or {})}
    write_json_atomic(path, obj)
    return Path(path)


def plot_figure12(rows: List[dict], path, title: Optional[str] = None) -> Optional[Path]:
    """Inference throughput vs input resolution per model and library (the paper's Figure 12, left), one
    panel per dtype / compile setting, plus peak memory per image vs resolution when measured."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    thr = [r for r in rows if r["kind"] == "inference"]
    mem = [r for r in rows if r["kind"] == "memory"]
    panels = sorted({(r["dtype"], r["compile"]) for r in thr})
    n = len(panels) + (1 if mem else 0)
    if n == 0:
        return None
    fig, axes = plt.subplots(1, n, figsize=(5.2 * n, 4.2), squeeze=False)
    for ax, (dtype, compiled) in zip(axes[0], panels):
        best: Dict[tuple, Dict[int, float]] = defaultdict(dict)
        for r in thr:
            if (r["dtype"], r["compile"]) != (dtype, compiled):
                continue
            cur = best[(r["model"], r["library"])]
            cur[r["img_size"]] = max(cur.get(r["img_size"], 0.0), r["images_per_s"])
        for (model, lib), pts in sorted(best.items(), key=lambda kv: (kv[0][0], _lib_key(kv[0][1]))):
            xs = sorted(pts)
            ax.plot(xs, [pts[x] for x in xs], "-o" if lib == "vitkit" else "--.", label=f"{model} {lib}",
                    linewidth=2 if lib == "vitkit" else 1)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("input size (px)")
        ax.set_ylabel("images / s (best batch)")
        ax.set_title(f"inference {dtype}{', compiled' if compiled else ''}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    if mem:
        ax = axes[0][-1]
        pts: Dict[tuple, Dict[int, float]] = defaultdict(dict)
        for r in mem:
            pts[(r["model"], r["library"], r["dtype"], r["batch"])][r["img_size"]] = r["peak_mib"]
        for (model, lib, dtype, batch), p in sorted(pts.items(), key=lambda kv: _lib_key(kv[0][1])):
            xs = sorted(p)
            ax.plot(xs, [p[x] for x in xs], "-o" if lib == "vitkit" else "--.",
                    label=f"{model} {lib} {dtype} b{batch}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("input size (px)")
        ax.set_ylabel("peak memory (MiB)")
        ax.set_title("inference peak memory")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)
    return Path(path)
