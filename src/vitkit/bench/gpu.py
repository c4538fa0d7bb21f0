"""GPU specifics: the peak rate that model FLOP utilisation (MFU) is measured against.

Peaks are the vendors' dense (no sparsity) figures for the tensor-core dtype
(bf16/fp16) and for plain fp32 (torch keeps fp32 matmuls in full fp32 unless
TF32 is enabled, and vitkit does not enable it). An unknown GPU is measured:
its peak is then the rate of a large square GEMM, and the row says so.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

# name fragment -> (bf16/fp16 dense TFLOP/s, fp32 TFLOP/s); SXM parts unless the name says PCIe/NVL
GPU_PEAKS = {
    "H200": (989.0, 67.0),
    "H100 PCIe": (756.0, 51.0),
    "H100 NVL": (835.0, 60.0),
    "H100": (989.0, 67.0),
    "GH200": (989.0, 67.0),
    "B200": (2250.0, 80.0),
    "A100": (312.0, 19.5),
    "L40S": (362.0, 91.6),
    "L4": (121.0, 30.3),
    "A10G": (70.0, 31.2),
    "A10": (125.0, 31.2),
    "V100": (125.0, 15.7),
    "T4": (65.0, 8.1),
}


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

