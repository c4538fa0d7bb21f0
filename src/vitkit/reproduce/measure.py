"""What is measured on a finished run, once (measures.json): validation and test accuracy, few-shot probes,
training compute, attention statistics (claim 9), the code version and machine; and the side-by-side speed
timing of claim 7.

The test split is read by the trainer's final evaluation only; everything used for choosing or probing comes
from the validation split held out of the training images (the trainer's own :func:`hold_out`).
"""
from __future__ import annotations

import functools
import json
import statistics
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from ..errors import ConfigError
from ..utils import write_json_atomic
from .budget import Budget
from .claims import Arm

MEASURES = "measures.json"
PROVENANCE = "provenance.json"


def code_version() -> Dict[str, Any]:
    """The code that runs, as a run's provenance records it: the git commit and whether the code differs from it
    (:func:`vitkit.version.code_version`, the same check as the benchmarks' machine lines), and the version."""
    from ..version import code_version as checkout

    code = checkout()
    return {"commit": code["commit"], "dirty": code["dirty"], "version": code["vitkit"]}


def code_id(code: Optional[Dict[str, Any]]) -> str:
    """One short name per code version (what the report compares)."""
    if not code:
        return "unrecorded"
    if code.get("commit"):
        return code["commit"][:12] + ("+dirty" if code.get("dirty") else "")
    return str(code.get("version")) if " then " in str(code.get("version")) else f"vitkit {code.get('version')}"


def record_provenance(folder: Path, plan: Optional[str] = None) -> None:
    """Written when a run starts: the code version, the machine and the analysis plan's hash (``plan``; None
    before plans). A run resumed by other code or on another machine adds them to ``resumed_with``, and its
    code then reads as a mix (:func:`code_id`); resumed under another plan, its plan reads as a mix."""
    from ..bench.machine import hardware

    path = folder / PROVENANCE
    now = {"code": code_version(), "machine": hardware()}
    if not path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, {**now, **({"plan": plan} if plan else {})})
        return
    prov = json.loads(path.read_text())
    if plan != prov.get("plan") and plan not in prov.get("plan_resumed", []):
        prov["plan_resumed"] = prov.get("plan_resumed", []) + [plan]
        write_json_atomic(path, prov)
    if now != {k: prov.get(k) for k in now} and now not in prov.get("resumed_with", []):
        prov["resumed_with"] = prov.get("resumed_with", []) + [now]
        write_json_atomic(path, prov)


def run_code(prov: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The code a run was trained with: one version, or (resumed by other code) a version named by all."""
    codes = [prov.get("code")] + [r["code"] for r in prov.get("resumed_with", []) if r.get("code") != prov.get("code")]
    if len(codes) == 1:
        return codes[0]
    return {"commit": None, "version": " then ".join(code_id(c) for c in codes)}


@functools.lru_cache(maxsize=4)
def open_split(spec: str, split: str, root: Optional[str]):
    """A dataset split, opened once per process (the probes of many runs read the same one)."""
    from ..data.datasets import open_dataset

    return open_dataset(spec, split, root=root)


def validation_split(recipe) -> Tuple[Any, Any]:
    """(training part, validation part) of the training split, held out exactly as the trainer does."""
    from ..train.selection import hold_out

    dc = recipe.data
    train, val = hold_out(open_split(dc.dataset, dc.train_split, dc.root), dc.val_size, dc.val_fraction, dc.val_seed)
    if val is None:
        raise ConfigError(f"recipe {recipe.name!r} has no validation split: set data.val_size")
    return train, val


def validation_top1(folder: Path) -> Optional[float]:
    """The exported weights' validation accuracy, as the trainer recorded it in results.json."""
    res = json.loads((folder / "results.json").read_text())
    kind = res.get("exported_weights")
    return float(res["val"][kind]["top1"]) if kind and kind in res.get("val", {}) else None


def learning_curve(folder: Path, key: str = "top1") -> List[List[float]]:
    """[epoch, validation top-1 of the raw weights] after every evaluation of the run, the final one included
    (one value per epoch); ``key`` "mpp_acc": masked patch prediction's accuracy on the corrupted patches."""
    from ..train.runlog import read_metrics

    path = folder / "metrics.jsonl"
    rows = read_metrics(path) if path.is_file() else []
    by_epoch = {r["epoch"]: r[key] for r in rows if r.get("kind") == "eval" and r.get("split") == "val" and
                r.get(key) is not None and not r.get("final")}
    return [[e, a] for e, a in sorted(by_epoch.items())]


def late_gain(curve: Sequence[Sequence[float]]) -> Optional[float]:
    """Validation top-1 at the end minus the best before the last quarter of the run: clearly above 0, the
    run was still improving when its schedule ended."""
    if len(curve) < 4:
        return None
    end = curve[-1][0]
    before = [acc for ep, acc in curve if ep <= 0.75 * end]
    return float(curve[-1][1] - max(before)) if before else None


def train_speed(folder: Path) -> Optional[float]:
    """Median training images per second over the run's metric lines (the first one, warm-up, left out)."""
    from ..train.runlog import read_metrics

    rates = [r["img_per_s"] for r in read_metrics(folder / "metrics.jsonl") if r.get("kind") == "train"]
    rates = rates[1:] or rates
    return float(statistics.median(rates)) if rates else None


def measure(arm: Arm, seed: int, budget: Budget, folder: Path, probe_recipe=None) -> Dict[str, Any]:
    """measures.json of a finished run (computed once). ``probe_recipe``: the recipe whose validation split
    the probes read (default: the run's own)."""
    from ..models.cost import cost
    from ..train import load_recipe
    from ..train.weights import load_for_eval

    path = folder / MEASURES
    if path.is_file():
        return json.loads(path.read_text())
    recipe = load_recipe(folder / "recipe.yaml")
    res = json.loads((folder / "results.json").read_text())
    model, _, _ = load_for_eval(folder / "model")
    c = cost(model.config)
    prov = json.loads((folder / PROVENANCE).read_text()) if (folder / PROVENANCE).is_file() else {}
    seen = int(res.get("steps") or 0) * int(recipe.optim.batch_size)
    m: Dict[str, Any] = {"arm": arm.name, "seed": seed, "params": c.params, "macs": c.macs,
                         "train_macs": 3 * c.macs * seen, "lr": recipe.optim.lr, "train_s": res.get("trained_s"),
                         "code": run_code(prov) if prov else None, "machine": prov.get("machine"),
                         "backend": recipe.train.backend,  # the kernels the run resolved (recipe.yaml)
                         "plan": prov.get("plan") if not prov.get("plan_resumed") else "mixed: " + " then ".join(
                             str(p) for p in [prov.get("plan")] + prov["plan_resumed"])}
    if arm.kind == "init":
        m["backend"] = "untrained"
        _, val = validation_split(recipe)
        m.update(inside(model, val, budget.analysis_images))
    elif arm.kind == "train":
        m["img_per_s"] = train_speed(folder)
        m["test_top1"] = res.get("test_top1")
        m["val_top1"] = validation_top1(folder)
        m["curve"] = learning_curve(folder)
        m["late_gain"] = late_gain(m["curve"])
        train_part, val = validation_split(probe_recipe or recipe)
        m.update(fewshot(model, train_part, val, budget))
        if arm.analysis:
            m.update(inside(model, val, budget.analysis_images))
    else:  # masked patch prediction: its curve (v3) is read by the convergence rule
        m["val_loss"] = (res.get("val") or {}).get("raw", {}).get("loss")
        m["curve"] = learning_curve(folder, "mpp_acc")
    write_json_atomic(path, m)
    return m


def fewshot(model, train_part, val, budget: Budget) -> Dict[str, float]:
    """k-shot linear accuracy of the frozen model (Section 4.1): shots and the L2 choice from the training
    part, accuracy on the validation images."""
    from ..eval.fewshot import evaluate_frozen

    out = evaluate_frozen(model, train_part.images, train_part.labels.numpy(), val.images, val.labels.numpy(),
                          shots=budget.fewshot_shots, seeds=budget.fewshot_seeds, progress=False,
                          num_classes=len(val.classes))
    return {f"fewshot_{r['shots']}": r["mean"] for r in out["fewshot"]}


def inside(model, val, n_images: int) -> Dict[str, Any]:
    """Claim 9's statistics: attention distances per layer and head (pixels) on validation images, relative
    to uniform attention's, and the row/column structure of the position embeddings."""
    from ..analysis.distance import attention_distance, mean_attention_distance
    from ..analysis.posemb_similarity import posemb_similarity
    from ..eval.features import model_preprocessing, prepare_images

    cfg = model.config
    if cfg.depth == 0:
        return {}
    x = prepare_images(val.images[:n_images], cfg.img_size, cfg.in_chans, model_preprocessing(model))
    dist = mean_attention_distance(model, list(x.split(64)))  # [layers, heads]
    t = cfg.seq_len
    uniform = float(attention_distance(torch.full((1, 1, t, t), 1.0 / t), cfg.grid_size, cfg.pixel_patch_size,
                                       cfg.num_prefix_tokens)[0])
    l0 = dist[0]
    out: Dict[str, Any] = {"distance": dist.tolist(), "uniform_distance": uniform,
                           "l0_mean_dist": float(l0.mean()), "l0_max_rel": float(l0.max()) / uniform,
                           "l0_min_rel": float(l0.min()) / uniform,
                           "l0_spread_rel": float(l0.max() - l0.min()) / uniform,
                           "dist_growth": float(dist[-1].mean() - dist[0].mean())}
    if cfg.posemb in ("learn", "learn2d", "sincos2d"):
        out["posemb_rowcol"] = rowcol_excess(posemb_similarity(model))
    return out


def rowcol_excess(sim: torch.Tensor) -> float:
    """Mean cosine similarity of position embeddings that share a row or a column, minus that of pairs
    that share neither (self-pairs left out): > 0 is the 2D structure of Figure 7 (centre)."""
    gh, gw = sim.shape[:2]
    r = torch.arange(gh).view(gh, 1, 1, 1).expand(gh, gw, gh, gw)
    c = torch.arange(gw).view(1, gw, 1, 1).expand(gh, gw, gh, gw)
    r2 = torch.arange(gh).view(1, 1, gh, 1).expand(gh, gw, gh, gw)
    c2 = torch.arange(gw).view(1, 1, 1, gw).expand(gh, gw, gh, gw)
    same = (r == r2) ^ (c == c2)  # one shared, not both (that is the patch itself)
    other = (r != r2) & (c != c2)
    return float(sim[same].double().mean() - sim[other].double().mean())


def paired_speed(folders: Dict[str, Path], *, repeats: int = 7, min_seconds: float = 0.5) -> Dict[str, List[float]]:
    """Training images per second of each run's model, timed side by side in this process: the run's own
    recipe (model, batch size, optimiser, precision, clipping) on a synthetic batch, one optimiser step per
    call, the runs alternated round by round. One rate per round and run."""
    from ..timing import alternate
    from ..train import load_recipe
    from ..train.optim import build_optimizer
    from ..train.step import TrainStep
    from ..train.weights import load_for_eval

    cases, batch = {}, {}
    for name, folder in folders.items():
        recipe = load_recipe(folder / "recipe.yaml")
        model = load_for_eval(folder / "model")[0].train()
        cfg, o = model.config, recipe.optim
        step = TrainStep(model, build_optimizer(model, o, torch.device("cpu")), precision=recipe.train.precision,
                         clip_grad=o.clip_grad, label_smoothing=recipe.augment.label_smoothing)
        g = torch.Generator().manual_seed(0)
        x = torch.randn(o.batch_size, cfg.in_chans, *cfg.img_size, generator=g)
        y = torch.randint(0, cfg.num_classes, (o.batch_size,), generator=g)
        cases[name] = (lambda st, xx, yy: lambda: float(st(xx, yy)["loss"]))(step, x, y)
        batch[name] = o.batch_size
    timed = alternate(cases, warmup=2, repeats=repeats, min_seconds=min_seconds)
    return {n: [batch[n] / t for t in timed[n].times] for n in folders}


def subset_values(measures: Sequence[Dict[str, Any]], metric: str) -> Dict[int, float]:
    """{seed: value} of one metric over a run's measured seeds."""
    return {int(m["seed"]): m[metric] for m in measures if m.get(metric) is not None}


SPEED_FILE = "paired_speed.json"


def stored_speed(folders: Dict[str, Path], rounds: int, log=print, time_now: bool = True) -> Dict[str, List[float]]:
    """The side-by-side speeds of the campaign, timed once (``rounds`` alternating rounds) and stored in the
    first run's folder (it travels with the campaign state); read back, never re-timed, ever after. With
    ``time_now`` False (a report of finished runs) nothing is timed: {} when none are stored."""
    names = sorted(folders)
    path = folders[names[0]] / SPEED_FILE
    if path.is_file():
        got = json.loads(path.read_text())
        if sorted(got.get("runs", {})) == names:
            return got["runs"]
    if not time_now:
        log(f"no stored side-by-side speeds of {', '.join(names)} ({path}): the report leaves them out")
        return {}
    log(f"timing {', '.join(names)} side by side, {rounds} rounds")
    from ..bench.machine import hardware

    speeds = paired_speed(folders, repeats=rounds)
    write_json_atomic(path, {"runs": speeds, "rounds": rounds, "machine": hardware(), "code": code_version()})
    return speeds
