"""Which machine a number was measured on: one line that every benchmark prints and saves.

A throughput means little without the CPU model, its vector instructions
(AVX2 / AVX-512 / AMX / native bf16 dot products), the thread count, the
torch build and how busy the machine was (load average): this module
gathers them.
"""
from __future__ import annotations

import datetime as _dt
import os
import platform
from typing import Any, Dict, Optional

import torch

from ..models.kernel_plan import cpu_fields, cpu_model_id
from ..models.kernel_plan import current as current_backend
from ..models.kernel_plan import source as backend_source
from ..models.ops import cpu_has_native_bf16
from ..version import code_version, describe_code

_ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16", "amx_tile")


def _cpu_model_and_flags() -> tuple:
    fields = cpu_fields()
    return fields.get("model name") or platform.processor() or platform.machine(), set(fields.get("flags", "").split())


def native_bf16_matmul(device: str = "cpu") -> bool:
    """Whether bf16 matrix products run on dedicated hardware (CUDA sm80+, or oneDNN's bf16 CPU kernels).

    On a CPU without AVX-512-BF16 / AMX / AVX2-VNNI-2, torch's bf16 GEMM falls
    back to a slow generic loop; vitkit then multiplies bf16 operands with the
    fp32 units instead (see :mod:`vitkit.models.ops`).
    """
    if str(device).startswith("cuda"):
        return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 8
    return cpu_has_native_bf16()


def chosen_paths(device: str = "cpu") -> Dict[str, Any]:
    """What vitkit runs here: the bf16 path and the declared backend with where it comes from (each model's
    own choices are its kernel plan, which results record beside this; nothing is measured here)."""
    cuda = str(device).startswith("cuda")
    return {"bf16": ("native bf16 (CUDA)" if cuda else
                     "native bf16 GEMMs (oneDNN: avx512_bf16/amx)" if cpu_has_native_bf16() else
                     "bf16 operands widened to fp32 (no bf16 GEMM hardware)"),
            "backend": {"declared": current_backend().spec, "source": backend_source()}}


def machine_info(device: str = "cpu") -> Dict[str, Any]:
    """A dict describing the machine, the torch build and the current load."""
    model, flags = _cpu_model_and_flags()
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    info: Dict[str, Any] = {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "host_cpu": model,
        "cpu_id": cpu_model_id(cpu_fields()),
        "cores": cores,
        "isa": [f for f in _ISA_FLAGS if f in flags],
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "mkl": torch.backends.mkl.is_available(),
        "mkldnn": torch.backends.mkldnn.is_available(),
        "native_bf16_matmul_cpu": native_bf16_matmul("cpu"),
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "device": str(device),
    }
    try:
        info["load_avg"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        info["load_avg"] = None
    try:
        info["mem_gib"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30, 1)
    except (ValueError, OSError, AttributeError):
        info["mem_gib"] = None
    info["paths"] = chosen_paths(device)
    info["code"] = code_version()
    if str(device).startswith("cuda") and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.device(device))
        info["gpu"] = props.name
        info["gpu_capability"] = f"{props.major}.{props.minor}"
        info["gpu_mem_gib"] = round(props.total_memory / 2 ** 30, 1)
        info["cuda"] = torch.version.cuda
    return info


def machine_line(info: Optional[Dict[str, Any]] = None, device: str = "cpu") -> str:
    """One line: date, CPU/GPU, instruction sets, threads, torch build, load average, the code (vitkit's
    version, commit, dirty) and the kernels chosen."""
    i = info or machine_info(device)
    cpu_id = f" [{i['cpu_id']}]" if i.get("cpu_id") else ""
    isa = " ".join(i["isa"]) or "no avx2"
    missing = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f not in i["isa"]]
    bf16 = "native bf16 matmul" if i["native_bf16_matmul_cpu"] else "no native bf16 matmul"
    parts = [
        f"machine: {i['date']}",
        f"{i['host_cpu']}{cpu_id} x{i['cores']} cores ({isa}{'; no ' + '/'.join(missing) if missing else ''}; {bf16})",
        f"{i['mem_gib']} GiB" if i.get("mem_gib") else None,
        f"torch {i['torch']} ({i['cpu_capability']}{', MKL' if i['mkl'] else ''}{', oneDNN' if i['mkldnn'] else ''})",
        f"threads {i['threads']}",
        f"load {' '.join(str(x) for x in i['load_avg'])}" if i.get("load_avg") else None,
        describe_code(i.get("code")),
    ]
    paths = i.get("paths") or {}
    if paths:
        rec = paths.get("backend") or {}
        parts.append(f"path: {paths['bf16']}; backend {rec.get('declared', '?')}")
    if i.get("gpu"):
        parts.insert(2, f"GPU {i['gpu']} (sm {i['gpu_capability']}, {i['gpu_mem_gib']} GiB, CUDA {i['cuda']})")
    return " | ".join(p for p in parts if p)


def hardware(info: Optional[Dict[str, Any]] = None) -> str:
    """The machine without the moment: CPU model, cores, instruction sets, GPU and torch build (no date, load
    or thread count), e.g. to record which kind of machine trained a run."""
    i = info or machine_info()
    gpu = f" | GPU {i['gpu']}" if i.get("gpu") else ""
    return f"{i['host_cpu']} x{i['cores']} cores ({' '.join(i['isa']) or 'no avx2'}){gpu} | torch {i['torch']}"


def busy_warning(info: Dict[str, Any]) -> Optional[str]:
    """A warning when the load average says other processes competed for the cores during the run."""
    load = info.get("load_avg")
    if load and load[0] > info["cores"] + 0.5:
        return (f"warning: load average {load[0]} on {info['cores']} cores: other processes were running, "
                f"absolute numbers are low; ratios from alternated runs are still comparable")
    return None


def set_threads(n: Optional[int]) -> int:
    """Use ``n`` intra-op threads (all libraries in the run share this setting); returns the count in use."""
    if n:
        torch.set_num_threads(int(n))
    return torch.get_num_threads()
