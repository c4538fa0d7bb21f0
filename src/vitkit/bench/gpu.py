"""GPU specifics: the peak rate that model FLOP utilisation (MFU) is measured against.

Peaks are the vendors' dense (no sparsity) figures for the tensor-core dtype
(bf16/fp16) and for plain fp32 (torch keeps fp32 matmuls in full fp32 unless
TF32 is enabled, and vitkit does not enable it). An unknown GPU is measured:
its peak is then the rate of a large square GEMM, and the row says so.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch


def _peaks(table: str) -> Dict[str, Tuple[float, float]]:
    """``"NAME LOW/FP32, ..."`` -> {NAME: (LOW, FP32)}, in the table's order."""
    out = {}
    for entry in table.split(","):
        name, rates = entry.strip().rsplit(" ", 1)
        low, fp32 = rates.split("/")
        out[name] = (float(low), float(fp32))
    return out


# name fragment, then bf16/fp16 dense TFLOP/s / fp32 TFLOP/s; SXM parts unless the name says PCIe/NVL
GPU_PEAKS = _peaks("""
    H200 989/67, H100 PCIe 756/51, H100 NVL 835/60, H100 989/67, GH200 989/67, B200 2250/80, A100 312/19.5,
    L40S 362/91.6, L4 121/30.3, A10G 70/31.2, A10 125/31.2, V100 125/15.7, T4 65/8.1
""")


def peak_flops(dtype: str, device: str = "cuda") -> Tuple[Optional[float], str]:
    """(peak FLOP/s for ``dtype`` on ``device``, where the number comes from)."""
    if not str(device).startswith("cuda") or not torch.cuda.is_available():
        return None, "no GPU"
    name = torch.cuda.get_device_name(torch.device(device))
    for key in sorted(GPU_PEAKS, key=len, reverse=True):
        if key in name:
            low, fp32 = GPU_PEAKS[key]
            return (fp32 if dtype == "fp32" else low) * 1e12, f"{key} datasheet (dense)"
    from .roofline import peak_gemm

    rate = peak_gemm(dtype, device, size=8192).flops_per_s
    return rate, f"measured 8192^3 GEMM ({name} not in the datasheet table)"

