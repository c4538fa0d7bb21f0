"""Same-seed training runs of each objective, and their fingerprints: what tests/test_train_same_results.py
compares with the values recorded before the training engine was restructured.

Every run goes through the public entry points only (``vitkit.train.train`` and
``vitkit.train.mpp.pretrain_mpp``), so the same code ran on the engine before and after. Recording the
expected values::

    PYTHONPATH=src:tests python -m _same_results          # prints the fingerprints as a Python dict

A fingerprint is the SHA-256 of the exported weights (names, dtypes, shapes, bytes), of the final checkpoint
(raw weights, EMA average and optimiser moments under the ViT's parameter names; step) and of the metrics
(every metrics.jsonl line and results.json less wall times, paths and the backend record), plus the
headline numbers in the clear.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Dict

import torch
from safetensors.torch import load_file

from _synthetic import write_npz

TINY = {"name": "tiny-same", "model": {"img_size": 16, "patch_size": 4, "width": 32, "depth": 2, "num_heads": 2,
                                       "mlp_dim": 64, "pool": "gap", "class_token": False},
        "data.mean": [0.2], "data.std": [0.3], "data.eval_batch_size": 64, "data.val_size": 64,
        "augment.crop": "pad", "augment.pad": 2, "augment.flip": False, "augment.label_smoothing": 0.1,
        "augment.erasing": 0.2, "optim.name": "adamw", "optim.lr": 5e-3, "optim.batch_size": 32,
        "optim.weight_decay": 0.05, "schedule.steps": 32, "schedule.warmup_steps": 4, "schedule.decay": "cosine",
        "train.ema": 0.9, "train.eval_every": 1, "train.ckpt_every": 4, "train.log_every": 4, "train.threads": 1,
        "train.predictions": 0, "train.backend": "gemm=aten,attention=fused"}
TOKEN = {"model.class_token": True, "model.pool": "token", "model.distill_token": True}
MPP = {"mpp.target": "color4x4", "mpp.eval_images": 64, "mpp.figure_images": 0, "optim.name": "adam",
       "optim.lr": 3e-3, "optim.weight_decay": 0.0, "augment.label_smoothing": 0.0, "augment.erasing": 0.0}
# make demo's recipe, 30 of its 5,584 steps, its test on a fixed 1,000 of the 10,000 test images
DEMO = {"schedule.steps": 30, "schedule.warmup_steps": 5, "data.test_subset": 1000, "train.threads": 1,
        "train.predictions": 0}

_WALL = ("time", "img_per_s", "train_wall_s", "trained_s", "train_time", "model", "backend", "teacher")


def _digest(tensors: Dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for k in sorted(tensors):
        v = tensors[k].detach().cpu().contiguous()
        h.update(f"{k}:{v.dtype}:{tuple(v.shape)};".encode())
        h.update(v.reshape(-1).view(torch.uint8).numpy().tobytes() if v.numel() else b"")
    return h.hexdigest()


def _flat(state: Any, prefix: str = "") -> Dict[str, torch.Tensor]:
    """The tensors (and numbers, as tensors) of a nested checkpoint dict, by dotted name."""
    out: Dict[str, torch.Tensor] = {}
    if isinstance(state, dict):
        for k, v in state.items():
            out.update(_flat(v, f"{prefix}{k}."))
    elif isinstance(state, (list, tuple)):
        for i, v in enumerate(state):
            out.update(_flat(v, f"{prefix}{i}."))
    elif isinstance(state, torch.Tensor):
        out[prefix[:-1]] = state
    elif isinstance(state, (int, float)) and not isinstance(state, bool):
        out[prefix[:-1]] = torch.tensor(float(state), dtype=torch.float64)
    return out


def _vit_names(state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Parameter names as the ViT names them: an objective that trains the ViT inside a wrapper module (the
    distillation token's two heads) stores them under ``vit.``."""
    return {k[4:] if k.startswith("vit.") else k: v for k, v in state.items()}


def fingerprint(run: Path) -> Dict[str, Any]:
    """The fingerprint of the finished run folder ``run`` (see the module's docstring)."""
    st = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    ckpt = {"model": _vit_names(st["model"]), "optimizer": _vit_names(st["optimizer"]["state"]), "step": st["step"]}
    if "ema" in st:
        ckpt["ema"] = _vit_names(st["ema"]["shadow"])
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    results = json.loads((run / "results.json").read_text())
    clean = [{k: v for k, v in r.items() if k not in _WALL} for r in rows + [results]]
    headline = {k: results[k] for k in ("test_top1", "test_loss", "val_mpp_loss", "teacher_test_top1", "steps")
                if k in results}
    return {"weights": _digest(load_file(str(run / "model" / "model.safetensors"))),
            "checkpoint": _digest(_flat(ckpt)),
            "metrics": hashlib.sha256(json.dumps(clean, sort_keys=True).encode()).hexdigest(), **headline}


def run_all(root: Path, which=("classification", "distill_hard_token", "distill_soft", "mpp", "demo")
            ) -> Dict[str, Dict[str, Any]]:
    """Train the runs named in ``which`` under ``root``; their fingerprints by name. The distillation runs
    learn from the classification run's exported model."""
    from vitkit.train import load_recipe, train
    from vitkit.train.mpp import pretrain_mpp

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    data = write_npz(root / "quadrants.npz")
    tiny = {**TINY, "data.dataset": f"tensors:{data}"}
    plans = {
        "classification": (train, load_recipe("fmnist-demo", tiny)),
        "distill_hard_token": (train, load_recipe("fmnist-demo", {
            **tiny, **TOKEN, "distill.teacher": str(root / "classification" / "model"), "distill.kind": "hard",
            "distill.alpha": 0.5})),
        "distill_soft": (train, load_recipe("fmnist-demo", {
            **tiny, "distill.teacher": str(root / "classification" / "model"), "distill.kind": "soft",
            "distill.alpha": 0.7, "distill.tau": 2.0})),
        "mpp": (pretrain_mpp, load_recipe("fmnist-mpp", {**tiny, **MPP})),
        "demo": (train, load_recipe("fmnist-demo", DEMO)),
    }
    out = {}
    for name in which:
        fn, recipe = plans[name]
        if name.startswith("distill") and not (root / "classification" / "model").is_dir():
            fn_c, rec_c = plans["classification"]
            fn_c(rec_c, root / "classification", progress=False)
        fn(recipe, root / name, progress=False)
        out[name] = fingerprint(root / name)
    return out


if __name__ == "__main__":
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        got = run_all(Path(d), tuple(sys.argv[1:]) or ("classification", "distill_hard_token", "distill_soft",
                                                        "mpp", "demo"))
    print(json.dumps(got, indent=1))
