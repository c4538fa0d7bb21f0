"""Schedule and run (arm, seed) pairs: in order, or ``jobs`` at a time in worker processes, a run starting
once its parent has finished; each run trained (or reused, or resumed) by :mod:`.runs`, then measured once
by :mod:`.measure`."""
from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from ..utils import PathLike
from .budget import Budget
from .claims import Arm
from .measure import MEASURES, measure
from .runs import is_done, load_arm_recipe, run_arm, run_folder


def train_and_measure(arm: Arm, seed: int, budget: Budget, root: PathLike, progress: bool = False) -> Dict[str, Any]:
    """One (arm, seed): trained (or reused, or resumed), then measured."""
    run_arm(arm, seed, budget, root, progress=progress)
    probe = load_arm_recipe(arm, seed, budget, Path(root), arm.probe_classes) if arm.probe_classes else None
    return measure(arm, seed, budget, run_folder(root, arm.name, seed), probe)


class _Progress:
    """The log lines: a run starting (training / resumed / reused), and a trained run finishing with the time
    left, estimated from the training time of the finished runs of each remaining arm, else of all."""

    def __init__(self, order: List[Tuple[str, int]], root: PathLike, jobs: int, log: Callable[[str], None],
                 stats: Optional[Dict[str, int]], after: Optional[Callable[[str, int], None]] = None):
        self.left, self.total, self.root, self.after = list(order), len(order), root, after
        self.jobs, self.log, self.stats = jobs, log, stats
        self.states: Dict[Tuple[str, int], str] = {}
        self.costs: Dict[str, List[float]] = {}
        self.t0, self.trained, self.done, self.started = time.perf_counter(), 0, 0, 0

    def start(self, name: str, seed: int) -> None:
        self.started += 1
        folder = run_folder(self.root, name, seed)
        state = "reused" if is_done(folder) else (
            "resumed" if (folder / "checkpoints" / "last.pt").is_file() else "training")
        self.states[(name, seed)] = state
        self.log(f"[{self.started}/{self.total}] {name} seed {seed}: {state}")
        if self.stats is not None:
            self.stats[state] = self.stats.get(state, 0) + 1

    def finish(self, name: str, seed: int, result: Dict[str, Any]) -> None:
        self.done += 1
        self.left.remove((name, seed))
        if result.get("train_s"):
            self.costs.setdefault(name, []).append(float(result["train_s"]))
        if self.states.get((name, seed)) == "reused":
            return
        if self.after is not None:
            self.after(name, seed)
        self.trained += 1
        spent = time.perf_counter() - self.t0
        eta = ""
        if self.left:
            every = [c for cs in self.costs.values() for c in cs]
            guess = statistics.median(every) if every else spent / self.trained
            todo = sum(statistics.mean(self.costs[n]) if self.costs.get(n) else guess for n, _ in self.left)
            eta = f"; {len(self.left)} to go, about {todo / max(1, self.jobs) / 3600:.1f} h of training"
        self.log(f"  {name} seed {seed} done ({self.done}/{self.total}; {spent / 60:.0f} min so far{eta})")


def run_all(names: Sequence[str], arms: Dict[str, Arm], budget: Budget, root: PathLike, *,
            progress: bool = False, log: Callable[[str], None] = print, stats: Optional[Dict[str, int]] = None,
            jobs: int = 1, seeds: Optional[Union[Sequence[int], Dict[str, Sequence[int]]]] = None,
            known: Optional[Dict[str, List[Dict[str, Any]]]] = None,
            after: Optional[Callable[[str, int], None]] = None) -> Dict[str, List[Dict[str, Any]]]:
    """Train and measure every (arm, seed) (``seeds``: default the budget's; or per arm); returns {arm: [measures per
    seed]}. ``stats`` (if given) counts the runs by what this call did: ``training``, ``resumed``, ``reused``.
    ``known``: measures this invocation already has (the sweep's runs), taken as they are. Seed-major order,
    so a partial campaign still has every arm at the first seeds. ``after(run, seed)`` is called as each run
    finishes (the campaign state is saved there)."""
    have = {(n, int(m["seed"])): m for n, ms in (known or {}).items() for m in ms}

    def seeds_of(name: str) -> Sequence[int]:
        return seeds[name] if isinstance(seeds, dict) else seeds if seeds is not None else budget.seeds
    every = sorted({s for n in names for s in seeds_of(n)})
    order = [(name, seed) for seed in every for name in names if seed in seeds_of(name) and (name, seed) not in have]
    prog = _Progress(order, root, jobs, log, stats, after)
    out: Dict[str, List[Dict[str, Any]]] = {}
    for (name, seed), m in have.items():
        if name in names and seed in seeds_of(name):
            out.setdefault(name, []).append(m)
    if jobs <= 1:
        for name, seed in order:
            prog.start(name, seed)
            result = train_and_measure(arms[name], seed, budget, root, progress)
            out.setdefault(name, []).append(result)
            prog.finish(name, seed, result)
    else:
        for name, ms in _run_parallel(order, arms, budget, root, jobs, prog).items():
            out.setdefault(name, []).extend(ms)
    return {k: sorted(v, key=lambda m: m["seed"]) for k, v in out.items()}


def _run_parallel(order: List[Tuple[str, int]], arms: Dict[str, Arm], budget: Budget, root: PathLike, jobs: int,
                  prog: _Progress) -> Dict[str, List[Dict[str, Any]]]:
    """One new process per run, at most ``jobs`` at once, each with its share of the cores. Ctrl-C, a
    kill (SIGTERM) or a failed run stops the others at once (each resumes from its last checkpoint)."""
    from multiprocessing.connection import wait

    ctx = _worker_context()
    threads = max(1, (os.cpu_count() or 1) // jobs)
    pending, out = list(order), {}
    running: Dict[Any, Tuple[Any, Tuple[str, int]]] = {}  # parent end of the pipe -> (process, run)
    try:
        with _terminate_as_interrupt():
            while pending or running:
                ready = [(n, s) for n, s in pending
                         if not arms[n].parent or is_done(run_folder(root, arms[n].parent, s))]
                for name, seed in ready[:max(0, jobs - len(running))]:
                    pending.remove((name, seed))
                    prog.start(name, seed)
                    here, there = ctx.Pipe(duplex=False)
                    proc = ctx.Process(target=_child, args=(there, arms[name], seed, budget, str(root), threads,
                                                            os.getpid(), dict(os.environ)), daemon=True)
                    proc.start()
                    there.close()
                    running[here] = (proc, (name, seed))
                if not running:  # a bug (parents are listed first); guards against a silent hang
                    raise AssertionError(f"runs waiting for parents that are not planned: {pending}")
                for conn in wait(list(running)):
                    proc, (name, seed) = running.pop(conn)
                    try:
                        status, payload = conn.recv()
                    except EOFError:
                        status, payload = "error", RuntimeError(f"the worker training {name} seed {seed} died "
                                                                f"(exit code {proc.join() or proc.exitcode})")
                    conn.close()
                    proc.join()
                    if status == "error":
                        raise payload
                    out.setdefault(name, []).append(payload)
                    prog.finish(name, seed, payload)
    except BaseException:
        for proc, _ in running.values():
            proc.terminate()
        for proc, _ in running.values():
            proc.join(timeout=10)
        raise
    return out


# what every run imports, loaded once by the process the workers fork from (torch.optim imports torch._dynamo
# and sympy when the first optimiser is built: 2-4 s a run otherwise); a module that fails to import is skipped
PRELOAD = ["torch", "torch._dynamo", "matplotlib.pyplot", "vitkit.train.trainer", "vitkit.reproduce.runner",
           "vitkit.reproduce.measure"]


def _worker_context():
    """Where ``forkserver`` exists (Linux), each worker forks from one server process that has imported
    :data:`PRELOAD` (it computes nothing, so no thread pool is forked); elsewhere each worker is spawned
    and imports them itself. Either way a run gets a new process: nothing of one run reaches the next."""
    import multiprocessing

    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)  # no effect once this process's server runs (it has them already)
    return ctx


def _gone(parent: int, first_ppid: int) -> bool:
    """Whether ``vitkit reproduce`` (pid ``parent``) has ended: this worker was re-parented (its parent, the
    command or the fork server, which exits with the command, ended) or that pid no longer exists."""
    if os.getppid() != first_ppid:
        return True
    try:
        os.kill(parent, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    return False


def _child(conn, arm: Arm, seed: int, budget: Budget, root: str, threads: int, parent: int,
           env: Dict[str, str]) -> None:
    """A worker: the command's environment as it is now (a fork server keeps the one it started with); its
    share of the cores; Ctrl-C in the terminal reaches the whole process group and only the parent acts on
    it; the worker ends itself when the parent is gone (a killed ``vitkit reproduce`` leaves no run training
    behind it)."""
    import signal

    import torch

    os.environ.clear()
    os.environ.update(env)
    torch.set_num_threads(threads)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # the parent stops a worker with SIGTERM: unwind (finalizers release the worker's semaphores) rather than
    # die at once, which leaves them for the resource tracker to report as leaked when the parent exits
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))

    first_ppid = os.getppid()

    def watch() -> None:
        while not _gone(parent, first_ppid):
            time.sleep(1.0)
        os._exit(1)
    threading.Thread(target=watch, daemon=True).start()
    try:
        conn.send(("ok", train_and_measure(arm, seed, budget, root)))
    except BaseException as err:  # sent back whole when it pickles, else as its traceback
        try:
            conn.send(("error", err))
        except Exception:
            conn.send(("error", RuntimeError(traceback.format_exc())))
    finally:
        conn.close()


@contextlib.contextmanager
def _terminate_as_interrupt():
    """SIGTERM (``kill``, a job scheduler's stop) handled like Ctrl-C while workers run."""
    import signal

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


def collected(names: Iterable[str], seeds: Union[Sequence[int], Dict[str, Sequence[int]]], root: PathLike
              ) -> Dict[str, List[Dict[str, Any]]]:
    """The measures already on disk (for a report without training; ``seeds``: of every run, or per run)."""
    out: Dict[str, List[Dict[str, Any]]] = {}
    for name in names:
        for seed in (seeds[name] if isinstance(seeds, dict) else seeds):
            p = run_folder(root, name, seed) / MEASURES
            if p.is_file():
                out.setdefault(name, []).append(json.loads(p.read_text()))
    return out
