"""Run the arms: one ordinary run folder per (arm, seed), reused when finished, resumed when interrupted,
then measured once (validation accuracy, few-shot accuracy, speed, attention statistics).

Layout under the output folder::

    runs/ARM/seedS/          a normal vitkit run folder (recipe.yaml, metrics.jsonl, checkpoints/, model/,
                             results.json) plus measures.json, written once the run is measured
    runs/ARM/seedS-init/     for arms that start from altered weights (claim 5's re-initialised embeddings)

The test split is read by the trainer's final evaluation only. Everything used for choosing (claim 2's
learning rate) or probing (few-shot, attention distances) comes from the validation split held out of the
training images (:func:`vitkit.reproduce.budget.validation_overrides`).
"""
from __future__ import annotations

import contextlib
import functools
import json
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from ..utils import PathLike, exclusive, write_json_atomic
from .budget import Budget, validation_overrides
from .claims import Arm, Claim, same_run

MEASURES = "measures.json"


# --- what to run -------------------------------------------------------------------------------------
def canonical(name: str, arms: Dict[str, Arm]) -> str:
    """The arm whose run folder serves ``name`` (the first arm with the same configuration)."""
    for other, arm in arms.items():
        if same_run(arm, arms[name]):
            return other
    return name


def needed_arms(claims: Sequence[Claim], arms: Dict[str, Arm], all_claims: Dict[int, Claim]) -> List[str]:
    """Canonical arm names the claims need, parents first. Claim 10 correlates the supervised models of the
    other claims asked for (all claims' when asked alone)."""
    names: List[str] = []
    ids = {c.id for c in claims}
    sources = [c for c in claims if c.id != 10]
    if 10 in ids and not sources:
        sources = [c for c in all_claims.values() if c.id != 10]
    for c in sources:
        for test in c.tests:
            names.extend(_selector_arms(n, arms) for n, _ in test.weights)
        names.extend(c.arms)
    out: List[str] = []

    def add(name: str) -> None:
        name = canonical(name, arms)
        if name in out:
            return
        if arms[name].parent:
            add(arms[name].parent)
        out.append(name)

    for n in names:
        for m in (n if isinstance(n, list) else [n]):
            add(m)
    return out


def _selector_arms(name: str, arms: Dict[str, Arm]) -> List[str]:
    """Every arm a name may resolve to (a selector needs its whole group)."""
    if name.startswith("best:") or "@best:" in name:
        groups = {name.split(":", 1)[1]} | ({name.split("@", 1)[0]} if "@" in name else set())
        return [a.name for a in arms.values() if a.group in groups]
    return [name]


def recipe_overrides(arm: Arm, seed: int, budget: Budget, root: Path) -> Dict[str, Any]:
    """The recipe keys (``--set`` semantics) of one arm at one seed under a budget."""
    ov: Dict[str, Any] = {}
    model = arm.full_model()
    if model is not None:
        ov["model"] = model
    b = budget
    if arm.length == "main" or arm.length == "finetune":
        epochs = b.epochs if arm.length == "main" else b.finetune_epochs
        ov.update({"data.train_subset": b.train_images, "schedule.epochs": epochs,
                   "schedule.warmup_epochs": round(0.1 * epochs, 4)})
    elif arm.length == "data":
        ov.update({"data.train_subset": arm.train_images, "schedule.steps": b.data_steps,
                   "schedule.warmup_steps": max(1, b.data_steps // 10)})
    elif arm.length == "mpp":
        ov.update({"schedule.epochs": b.mpp_epochs, "schedule.warmup_epochs": round(0.25 * b.mpp_epochs, 4)})
    elif arm.length == "few_labels":
        ov.update({"data.train_subset": b.few_labels, "schedule.epochs": b.few_label_epochs,
                   "schedule.warmup_epochs": round(min(5.0, b.few_label_epochs / 12), 4)})
    else:
        raise ValueError(f"arm {arm.name}: unknown length {arm.length!r}")
    ov.update(validation_overrides(b.val_size))
    ov.update({"train.seed": seed, "train.eval_every": 0, "train.ckpt_every": 0, "train.predictions": 0,
               "name": f"reproduce-{arm.name}"})
    if arm.parent:
        ov["init.checkpoint"] = str(init_folder(arm, seed, root) if arm.prepare else
                                    run_folder(root, arm.parent, seed) / "model")
    ov.update(arm.overrides)
    ov.update(b.extra)
    return ov


def run_folder(root: PathLike, arm: str, seed: int) -> Path:
    return Path(root) / "runs" / arm / f"seed{seed}"


def init_folder(arm: Arm, seed: int, root: PathLike) -> Path:
    return Path(root) / "runs" / arm.name / f"seed{seed}-init"


def is_done(folder: Path) -> bool:
    return (folder / "results.json").is_file() and (folder / "model").is_dir()


# --- running ---------------------------------------------------------------------------------------
def run_arm(arm: Arm, seed: int, budget: Budget, root: PathLike, *, progress: bool = False,
            stop_after: Optional[int] = None) -> Dict[str, Any]:
    """Train one (arm, seed) into its run folder: reuse a finished run, resume an interrupted one.
    ``stop_after`` stops the training after that many steps, as a kill would (for tests)."""
    from ..train import load_recipe

    root = Path(root)
    out = run_folder(root, arm.name, seed)
    recipe = load_recipe(arm.recipe, recipe_overrides(arm, seed, budget, root))
    if is_done(out):
        _check_same_recipe(out, recipe, root)
        return json.loads((out / "results.json").read_text())
    # one process per run folder: a second invocation (or a worker left over from a killed one) stops here
    with exclusive(out.parent / f"{out.name}.lock", wait=False,
                   busy=f"{out} is being trained by another process: wait for it, or stop it first"):
        if is_done(out):  # finished while we waited for the lock's holder
            return json.loads((out / "results.json").read_text())
        if arm.prepare:
            _prepare(arm, seed, root, recipe)
        resume = (out / "checkpoints" / "last.pt").is_file()
        if resume:
            _check_same_recipe(out, recipe, root)
        if arm.kind == "mpp":
            from ..train.mpp import MPPTrainer as trainer_class
        else:
            from ..train.trainer import Trainer as trainer_class
        trainer = trainer_class(recipe, out, resume=resume, progress=progress, stop_after=stop_after)
        from ..train import distributed as D
        try:
            return trainer.fit()
        finally:
            D.teardown()


def _check_same_recipe(out: Path, recipe, root: Path) -> None:
    import yaml

    from ..errors import ConfigError

    saved, now = yaml.safe_load((out / "recipe.yaml").read_text()), yaml.safe_load(recipe.to_yaml())
    for d in (saved, now):  # the MPP trainer records its head-less model (num_classes 0) itself
        d["model"].pop("num_classes", None)
    # a fine-tune starts from a run of the same OUT folder (root): the same run whatever OUT is called now
    # (moved, reached through a link, given relative or absolute)
    init_saved, init_now = (d.get("init") or {} for d in (saved, now))
    if init_saved.get("checkpoint") and init_now.get("checkpoint"):
        try:
            tail = Path(init_now["checkpoint"]).relative_to(root).parts
        except ValueError:
            tail = None
        if tail and Path(init_saved["checkpoint"]).parts[-len(tail):] == tail:
            init_saved["checkpoint"] = init_now["checkpoint"]
    if saved != now:
        raise ConfigError(f"{out} holds a run of another configuration (a different budget or vitkit version?): "
                          f"give another --out, or delete that folder to run it again")


def _prepare(arm: Arm, seed: int, root: Path, recipe) -> None:
    """Starting weights that are not simply the parent's model (written once)."""
    dest = init_folder(arm, seed, root)
    if (dest / "vitkit.json").is_file() and (dest / "model.safetensors").is_file():
        return
    from ..checkpoints import save_model
    from ..models import VisionTransformer
    from ..train.weights import load_for_eval

    if arm.prepare != "reinit_posemb":
        raise ValueError(f"arm {arm.name}: unknown preparation {arm.prepare!r}")
    model, labels, pre = load_for_eval(run_folder(root, arm.parent, seed) / "model")
    if model.pos_embed is None:
        raise ValueError(f"arm {arm.name}: re-initialising position embeddings needs posemb='learn'")
    size = recipe.model.get("img_size", model.config.img_size)
    model.set_img_size(size)
    torch.manual_seed(seed)
    fresh = VisionTransformer(model.config)  # the model's own initialisation at the new grid
    with torch.no_grad():
        model.pos_embed.copy_(fresh.pos_embed)
    save_model(model, dest, labels=labels, preprocessing=pre, extra={"note": "position embeddings re-initialised"})


# --- measuring -------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=4)
def _dataset(spec: str, split: str, root: Optional[str]):
    from ..data.datasets import open_dataset

    return open_dataset(spec, split, root=root)


def validation_split(recipe) -> Tuple[Any, Any]:
    """(training part, validation part) of the training split, held out exactly as the trainer holds them
    out (``Trainer._build_data``; tests/test_reproduce.py checks that the two agree)."""
    from ..train.selection import hold_out

    dc = recipe.data
    train, val = hold_out(_dataset(dc.dataset, dc.train_split, dc.root), dc.val_size, dc.val_fraction, dc.val_seed)
    if val is None:
        raise ValueError(f"recipe {recipe.name!r} has no validation split: set data.val_size")
    return train, val


def validation_top1(folder: Path, recipe, model, val) -> float:
    """The exported weights' validation accuracy, as the trainer recorded it in results.json (measured here
    with the trainer's own evaluation for a run folder without it)."""
    res = json.loads((folder / "results.json").read_text())
    kind = res.get("exported_weights")
    if kind and kind in res.get("val", {}):
        return float(res["val"][kind]["top1"])
    from ..data.augment import EvalTransform, Normalize
    from ..train.evaluate import evaluate

    tf = EvalTransform(model.config.img_size, Normalize(recipe.data.mean, recipe.data.std,
                                                        channels=model.config.in_chans))
    return float(evaluate(model, val, tf, batch_size=recipe.data.eval_batch_size)["top1"])


def train_speed(folder: Path) -> Optional[float]:
    """Median training images per second over the run's metric lines (the first one, warm-up, left out)."""
    from ..train.runlog import read_metrics

    rates = [r["img_per_s"] for r in read_metrics(folder / "metrics.jsonl") if r.get("kind") == "train"]
    rates = rates[1:] or rates
    return float(statistics.median(rates)) if rates else None


def measure(arm: Arm, seed: int, budget: Budget, root: PathLike) -> Dict[str, Any]:
    """measures.json of a finished run (computed once)."""
    from ..bench.machine import hardware
    from ..models.cost import cost
    from ..train import load_recipe
    from ..train.weights import load_for_eval

    folder = run_folder(root, arm.name, seed)
    path = folder / MEASURES
    if path.is_file():
        return json.loads(path.read_text())
    recipe = load_recipe(folder / "recipe.yaml")
    res = json.loads((folder / "results.json").read_text())
    model, _, _ = load_for_eval(folder / "model")
    c = cost(model.config)
    m: Dict[str, Any] = {"arm": arm.name, "seed": seed, "params": c.params, "macs": c.macs,
                         "img_per_s": train_speed(folder), "train_s": res.get("trained_s"),
                         "machine": hardware()}  # measured right after training, on the machine that trained it
    if arm.kind == "train":
        train_part, val = validation_split(recipe)
        m["test_top1"] = res.get("test_top1")
        m["val_top1"] = validation_top1(folder, recipe, model, val)
        m.update(fewshot(model, train_part, val, budget))
        if arm.analysis:
            m.update(inside(model, val, budget.analysis_images))
    write_json_atomic(path, m)
    return m


def fewshot(model, train_part, val, budget: Budget) -> Dict[str, float]:
    """k-shot linear accuracy of the frozen model (Section 4.1): shots and the L2 choice from the training
    part, accuracy on the validation images."""
    from ..eval.fewshot import evaluate_frozen

    out = evaluate_frozen(model, train_part.images, train_part.labels.numpy(), val.images, val.labels.numpy(),
                          shots=budget.fewshot_shots, seeds=budget.fewshot_seeds, progress=False,
                          num_classes=model.config.num_classes)
    return {f"fewshot_{r['shots']}": r["mean"] for r in out["fewshot"]}


def inside(model, val, n_images: int) -> Dict[str, Any]:
    """Claim 9's statistics: attention distances per layer and head (pixels) on validation images, and
    the row/column structure of the position embeddings."""
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
    out: Dict[str, Any] = {"distance": dist.tolist(), "uniform_distance": uniform,
                           "l0_mean_dist": float(dist[0].mean()), "l0_max_rel": float(dist[0].max()) / uniform,
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


def paired_speed(names: Sequence[str], arms: Dict[str, Arm], budget: Budget, root: PathLike, *,
                 repeats: int = 7, min_seconds: float = 0.5) -> Dict[str, List[float]]:
    """Training images per second of each arm's model, timed side by side in this process: the arm's own
    recipe (model, batch size, optimiser, precision, clipping) on a synthetic batch, one optimiser step per
    call, the arms alternated round by round (:func:`vitkit.bench.timing.alternate`). Returns one rate per
    round and arm. Speed comparisons read these rather than the training logs, whose runs may have shared
    the machine with other work or run on another machine (a report can be resumed across days)."""
    from ..bench.timing import alternate
    from ..train import load_recipe
    from ..train.optim import build_optimizer
    from ..train.step import TrainStep
    from ..train.weights import load_for_eval

    root = Path(root)
    cases, batch = {}, {}
    for name in names:
        arm = arms[name]
        folder = run_folder(root, arm.name, budget.seeds[0])
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
    return {n: [batch[n] / t for t in timed[n].times] for n in names}


def run_all(names: Sequence[str], arms: Dict[str, Arm], budget: Budget, root: PathLike, *,
            progress: bool = False, log: Callable[[str], None] = print,
            stats: Optional[Dict[str, int]] = None, jobs: int = 1) -> Dict[str, List[Dict[str, Any]]]:
    """Train and measure every (arm, seed); returns {arm: [measures per seed]}. ``stats`` (if given) counts
    the runs by what this call did with them: ``training`` (from scratch), ``resumed``, ``reused``.
    ``jobs`` > 1 runs that many (arm, seed) pairs at once in worker processes that share the CPU cores
    between them (:func:`_worker_init`); a run starts once its parent run has finished."""
    order = [(name, seed) for seed in budget.seeds for name in names]  # seed-major: a partial run still
    total = len(order)                                                 # has every arm at the first seeds
    states: Dict[Tuple[str, int], str] = {}
    t0, trained, done = time.perf_counter(), 0, 0
    costs: Dict[str, List[float]] = {}  # training seconds of each arm's finished runs
    left: List[Tuple[str, int]] = list(order)

    def announce(i: int, name: str, seed: int) -> None:
        folder = run_folder(root, name, seed)
        state = "reused" if is_done(folder) else (
            "resumed" if (folder / "checkpoints" / "last.pt").is_file() else "training")
        states[(name, seed)] = state
        log(f"[{i}/{total}] {name} seed {seed}: {state}")
        if stats is not None:
            stats[state] = stats.get(state, 0) + 1

    def finished(name: str, seed: int, result: Dict[str, Any]) -> None:
        """A line per trained run: how long this invocation has run and what is left, estimated from the
        training time of the finished runs of each remaining arm (arms differ by 25x here), else of all."""
        nonlocal trained, done
        done += 1
        left.remove((name, seed))
        if result.get("train_s"):
            costs.setdefault(name, []).append(float(result["train_s"]))
        if states.get((name, seed)) == "reused":
            return
        trained += 1
        spent = time.perf_counter() - t0
        eta = ""
        if left:
            every = [c for cs in costs.values() for c in cs]
            guess = statistics.median(every) if every else spent / trained
            todo = sum(statistics.mean(costs[n]) if costs.get(n) else guess for n, _ in left)
            eta = f"; {len(left)} to go, about {todo / max(1, jobs) / 3600:.1f} h of training"
        log(f"  {name} seed {seed} done ({done}/{total}; {spent / 60:.0f} min so far{eta})")

    out: Dict[str, List[Dict[str, Any]]] = {}
    if jobs <= 1:
        for i, (name, seed) in enumerate(order, 1):
            announce(i, name, seed)
            result = train_and_measure(arms[name], seed, budget, root, progress)
            out.setdefault(name, []).append(result)
            finished(name, seed, result)
    else:
        out = _run_parallel(order, arms, budget, root, jobs, announce, finished)
    return {k: sorted(v, key=lambda m: m["seed"]) for k, v in out.items()}


def train_and_measure(arm: Arm, seed: int, budget: Budget, root: PathLike, progress: bool = False) -> Dict[str, Any]:
    """One (arm, seed): trained (or reused, or resumed), then measured."""
    run_arm(arm, seed, budget, root, progress=progress)
    return measure(arm, seed, budget, root)


def _run_parallel(order: List[Tuple[str, int]], arms: Dict[str, Arm], budget: Budget, root: PathLike, jobs: int,
                  announce: Callable[[int, str, int], None],
                  finished: Callable[[str, int, Dict[str, Any]], None]
                  ) -> Dict[str, List[Dict[str, Any]]]:
    import multiprocessing
    import os
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    threads = max(1, (os.cpu_count() or 1) // jobs)
    pending, out = list(order), {}
    running: Dict[Any, Tuple[str, int]] = {}
    started = 0
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_worker_init, initargs=(threads,))
    try:
        with _terminate_as_interrupt():
            while pending or running:
                ready = [(n, s) for n, s in pending
                         if not arms[n].parent or is_done(run_folder(root, arms[n].parent, s))]
                for name, seed in ready[:max(0, jobs - len(running))]:
                    pending.remove((name, seed))
                    started += 1
                    announce(started, name, seed)
                    running[pool.submit(train_and_measure, arms[name], seed, budget, root)] = (name, seed)
                if not running:  # cannot happen with parents listed first; guards against a silent hang
                    raise RuntimeError(f"runs waiting for parents that are not planned: {pending}")
                done, _ = wait(list(running), return_when=FIRST_COMPLETED)
                for fut in done:
                    name, seed = running.pop(fut)
                    result = fut.result()  # a failed run stops the call, as it does in order
                    out.setdefault(name, []).append(result)
                    finished(name, seed, result)
    except BaseException:
        # Ctrl-C, a kill, or a failed run: the other runs stop now rather than train on unseen (each resumes
        # from its last checkpoint next time), and the interrupt reaches the command line as one line
        _stop_workers(pool)
        raise
    pool.shutdown()
    return out


@contextlib.contextmanager
def _terminate_as_interrupt():
    """SIGTERM (``kill``, a job scheduler's stop) handled like Ctrl-C while workers run, so that the workers
    are stopped and the pool's resources released before the command exits."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stop_workers(pool) -> None:
    """Terminate a process pool's workers at once (their runs resume from their checkpoints) and let it go."""
    stop = getattr(pool, "terminate_workers", None)  # Python >= 3.14
    if stop is not None:
        stop()
        return
    for proc in list((getattr(pool, "_processes", None) or {}).values()):
        if proc.is_alive():
            proc.terminate()
    for proc in list((getattr(pool, "_processes", None) or {}).values()):
        proc.join(timeout=10)
    pool.shutdown(wait=False, cancel_futures=True)


def _worker_init(threads: int) -> None:
    """A worker of ``--jobs``: its share of the cores; Ctrl-C in the terminal reaches the whole process group,
    and only the parent acts on it (it stops the workers); and (Linux) a worker dies with the process that
    started it, so that a killed ``vitkit reproduce`` leaves no run training behind it."""
    import signal

    torch.set_num_threads(threads)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def collected(names: Iterable[str], budget: Budget, root: PathLike) -> Dict[str, List[Dict[str, Any]]]:
    """The measures already on disk (for a report without training)."""
    out: Dict[str, List[Dict[str, Any]]] = {}
    for name in names:
        for seed in budget.seeds:
            p = run_folder(root, name, seed) / MEASURES
            if p.is_file():
                out.setdefault(name, []).append(json.loads(p.read_text()))
    return out
