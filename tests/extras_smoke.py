"""Each extra's commands, run for real in an environment with only the core and that extra (`make test-extras`).

The test environment installs every extra, so a command that imports a package its extra does not declare
passes there and fails for a user who installed only that extra (``vitkit reproduce`` once needed scipy
and said so after 16 minutes of training). Here each extra gets its own environment
(``.venv-extra-NAME``: the core, then ``pip install -e '.[NAME]'``) and this script runs that extra's
commands in it, with tiny settings (a 2-block 32 px checkpoint, a 16 px synthetic task); and in the core-only
environment (``.venv-core``) every such command must stop before any work with exit code 1 and one line
naming the extra to install, not a traceback.

Run it with the environment's own interpreter::

    .venv-core/bin/python tests/extras_smoke.py core
    .venv-extra-onnx/bin/python tests/extras_smoke.py onnx

It prints one line per command and exits 1 when one failed, naming the extra and the command. Nothing here
needs more than the core: the checkpoint, images, data and the loopback Hub server come from the tests'
helpers (``_serve``, ``_synthetic``, ``_http_server``); HTTP goes through the standard library.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# what each extra lets Python import (its distinctive modules): the core environment must have none of them,
# else its expected failures test nothing
MODULES = {
    "plots": ["matplotlib"], "hub": ["huggingface_hub"], "onnx": ["onnx", "onnxruntime"], "bench": ["transformers"],
    "hf": ["transformers"], "log": ["tensorboard"], "reproduce": ["scipy", "matplotlib"], "wandb": ["wandb"],
    "mlflow": ["mlflow"], "openvino": ["openvino", "onnx"], "ray": ["ray"],
    "serve": ["fastapi", "uvicorn", "prometheus_client"],
}
# extras vitkit's code names (require / MissingDependency) that get no environment here, and why
NO_ENVIRONMENT = {
    "ray": "Ray Serve is hundreds of MB; tests/test_serve_ray.py runs `vitkit serve --ray` in the test environment, "
           "and the serve environment checks that --ray without it stops in one line naming the extra",
    "datasets": "a library feature (vitkit.data.from_dataset takes any Dataset object): no command imports it",
    "docs": "make api-docs (pdoc), not a vitkit command",
}
MISSING_WITHIN_S = 60.0  # an expected failure must come this soon (it comes in seconds: the bound catches hours)
READY_WITHIN_S = 180.0  # vitkit serve's start on a loaded 2-core CI machine (as tests/test_serve.py allows)


class Failed(Exception):
    """One command did not do what its extra promises."""


class Run:
    """The shared inputs (made once, in a temporary folder) and the way to run a command."""

    def __init__(self, extra: str, tmp: Path):
        self.extra, self.tmp = extra, tmp
        self.env = {k: v for k, v in os.environ.items()
                    if k != "VITKIT_BACKEND" and not k.startswith(("HF_", "HUGGINGFACE_", "WANDB_", "MLFLOW_"))}
        self.env.update(XDG_CACHE_HOME=str(tmp / "cache"), HF_HOME=str(tmp / "hf"), HF_HUB_DISABLE_TELEMETRY="1",
                        MPLCONFIGDIR=str(tmp / "mpl"), PYTHONUNBUFFERED="1", WANDB_MODE="offline",
                        WANDB_SILENT="true", TQDM_DISABLE="1")
        self._made: Dict[str, Path] = {}

    # --- inputs -----------------------------------------------------------------------------------
    @property
    def ckpt(self) -> Path:
        """A random 2-block ViT at 32 px with 5 labels, in vitkit's format."""
        if "ckpt" not in self._made:
            from _serve import tiny_checkpoint
            self._made["ckpt"] = Path(tiny_checkpoint(self.tmp / "ckpt"))
        return self._made["ckpt"]

    @property
    def image(self) -> Path:
        if "image" not in self._made:
            from _serve import image_bytes
            path = self.tmp / "photo.png"
            path.write_bytes(image_bytes())
            self._made["image"] = path
        return self._made["image"]

    @property
    def recipe(self) -> Path:
        """The tests' tiny training recipe (16 px, 2 blocks, 16 steps an epoch) on a synthetic task."""
        if "recipe" not in self._made:
            from _synthetic import write_npz, write_recipe
            folder = self.tmp / "task"
            folder.mkdir()
            self._made["recipe"] = write_recipe(folder, write_npz(folder / "quadrants.npz"))
        return self._made["recipe"]

    def out(self, name: str) -> Path:
        return self.tmp / "out" / name

    def train_args(self, out: Path, *sets: str) -> List[str]:
        args = ["train", "--recipe", str(self.recipe), "--out", str(out), "--no-progress",
                "--set", "schedule.epochs=1"]
        for s in sets:
            args += ["--set", s]
        return args

    # --- running ----------------------------------------------------------------------------------
    def vitkit(self, *args: str, timeout: float = 300, env: Optional[Dict[str, str]] = None
               ) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "vitkit", *map(str, args)]
        t0 = time.monotonic()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=self.tmp,
                                  env=dict(self.env, **(env or {})))
        except subprocess.TimeoutExpired:
            raise Failed(f"did not finish within {timeout:g} s") from None
        proc.elapsed = time.monotonic() - t0  # type: ignore[attr-defined]
        return proc

    def ok(self, *args: str, timeout: float = 300, env: Optional[Dict[str, str]] = None) -> str:
        """Run a command that must succeed; its stdout."""
        proc = self.vitkit(*args, timeout=timeout, env=env)
        if proc.returncode != 0:
            raise Failed(f"exit code {proc.returncode}:\n{tail(proc.stderr or proc.stdout)}")
        return proc.stdout

    def missing(self, extra: str, *args: str, absent: Sequence[Path] = (), alone: bool = True) -> None:
        """Run a command that must stop before any work because ``extra`` is not installed."""
        proc = self.vitkit(*args, timeout=MISSING_WITHIN_S * 2)
        problems = missing_problems(proc.returncode, proc.stderr, extra, args[0], proc.elapsed, alone=alone)
        problems += [f"{p} exists: work was done before the check" for p in absent if p.exists()]
        if problems:
            raise Failed("; ".join(problems) + f"\nstderr:\n{tail(proc.stderr)}")


def tail(text: str, lines: int = 25) -> str:
    return "\n".join("    " + ln for ln in (text or "").strip().splitlines()[-lines:])


def missing_problems(code: int, stderr: str, extra: str, command: str, elapsed: float, *, alone: bool = True
                     ) -> List[str]:
    """What is wrong with a command's answer to a missing extra (nothing: a list that is empty). The answer
    must be exit code 1 and one line ``vitkit COMMAND: error: ... pip install 'vitkit[EXTRA]' ...`` (with
    ``alone``, the only line on stderr; else the last, after log lines), no traceback, within
    MISSING_WITHIN_S."""
    problems = []
    lines = [ln for ln in (stderr or "").strip().splitlines() if ln.strip()]
    if code != 1:
        problems.append(f"exit code {code}, not 1 (an expected failure)")
    if "Traceback (most recent call last)" in (stderr or ""):
        problems.append("a traceback")
    want = f"pip install 'vitkit[{extra}]'"
    last = lines[-1] if lines else ""
    if not (last.startswith(f"vitkit {command}: error: ") and want in last):
        problems.append(f"the last line of stderr is not `vitkit {command}: error: ...{want}...`")
    elif alone and len(lines) != 1:
        problems.append(f"{len(lines)} lines on stderr, not one")
    if elapsed > MISSING_WITHIN_S:
        problems.append(f"took {elapsed:.0f} s (more than {MISSING_WITHIN_S:g} s: work before the check?)")
    return problems


def report_json(stdout: str) -> dict:
    try:
        return json.loads(stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        raise Failed(f"no JSON report on stdout:\n{tail(stdout)}") from None


# --- the checks: (the command as shown, function) per extra ------------------------------------------------
Check = Callable[[Run], None]
CHECKS: Dict[str, List[tuple]] = {}


def check(extra: str, shown: str):
    def add(fn: Check) -> Check:
        CHECKS.setdefault(extra, []).append((shown, fn))
        return fn
    return add


# core: what needs nothing more works, and each command of an extra stops at once naming it
@check("core", "vitkit smoke")
def _core_smoke(r: Run) -> None:
    r.ok("smoke")


@check("core", "vitkit predict -w CKPT IMAGE --json")
def _core_predict(r: Run) -> None:
    top = json.loads(r.ok("predict", "-w", r.ckpt, r.image, "--json", "--no-progress").strip().splitlines()[-1])
    if not top.get("top"):
        raise Failed(f"no top-k in {top}")


@check("core", "vitkit export CKPT model.pt2 (torch.export)")
def _core_export_pt2(r: Run) -> None:
    report_json(r.ok("export", r.ckpt, r.out("model.pt2")))


@check("core", "vitkit train (tiny recipe, 1 epoch)")
def _core_train(r: Run) -> None:
    out = r.out("train-core")
    r.ok(*r.train_args(out))
    if not (out / "model").is_dir() or not (out / "results.json").is_file():
        raise Failed(f"no model/ or results.json in {out}")


@check("core", "vitkit bench --peers hf (skipped, naming the bench extra)")
def _core_bench(r: Run) -> None:
    res = json.loads(r.ok(*BENCH, "--json"))
    if not any("hf skipped" in n and "vitkit[bench]" in n for n in res.get("notes", [])):
        raise Failed(f"no note that hf was skipped naming the bench extra: {res.get('notes')}")


@check("core", "vitkit export CKPT model.onnx")
def _core_onnx(r: Run) -> None:
    r.missing("onnx", "export", r.ckpt, r.out("model.onnx"), absent=[r.out("model.onnx")])


@check("core", "vitkit export CKPT model.xml (OpenVINO)")
def _core_openvino(r: Run) -> None:
    r.missing("openvino", "export", r.ckpt, r.out("model.xml"), absent=[r.out("model.xml"), r.out("model.bin")])


@check("core", "vitkit serve CKPT")
def _core_serve(r: Run) -> None:
    r.missing("serve", "serve", r.ckpt, "--port", str(free_port()))


@check("core", "vitkit analyze CKPT IMAGE --out DIR")
def _core_analyze(r: Run) -> None:
    r.missing("plots", "analyze", r.ckpt, r.image, "--out", r.out("analyze-core"), absent=[r.out("analyze-core")])


def _core_tracker(tracker: str, extra: str, folder: str) -> Check:
    """train.log=[TRACKER] without its extra: stops before any run folder exists, naming the extra."""
    def run(r: Run) -> None:
        out = r.out(folder)
        r.missing(extra, *r.train_args(out, f"train.log=[{tracker}]"), absent=[out])
    return run


for _tracker, _extra, _folder in (("tensorboard", "log", "train-tb-core"), ("wandb", "wandb", "train-wandb-core"),
                                  ("mlflow", "mlflow", "train-mlflow-core")):
    check("core", f"vitkit train --set train.log=[{_tracker}]")(_core_tracker(_tracker, _extra, _folder))


@check("core", "vitkit inspect OWNER/NAME (a Hub id)")
def _core_hub(r: Run) -> None:
    r.missing("hub", "inspect", "acme/vit-tiny-test")


@check("core", "vitkit push CKPT OWNER/NAME")
def _core_push(r: Run) -> None:
    r.missing("hub", "push", r.ckpt, "acme/vit-tiny-test")


@check("core", "vitkit reproduce --claims 8")
def _core_reproduce(r: Run) -> None:
    r.missing("reproduce", "reproduce", "--claims", "8", "--out", r.out("rep-core"), absent=[r.out("rep-core")])


# onnx: the export, checked with onnxruntime
@check("onnx", "vitkit export CKPT model.onnx")
def _onnx_export(r: Run) -> None:
    rep = report_json(r.ok("export", r.ckpt, r.out("model.onnx")))
    if not str(rep.get("validated", "")).startswith("onnxruntime"):
        raise Failed(f"not checked with onnxruntime: {rep}")


# openvino: the IR, converted from vitkit's ONNX graph and checked on OpenVINO's CPU plugin
@check("openvino", "vitkit export CKPT model.xml")
def _openvino_export(r: Run) -> None:
    rep = report_json(r.ok("export", r.ckpt, r.out("model.xml")))
    if not str(rep.get("validated", "")).startswith("openvino") or not r.out("model.bin").is_file():
        raise Failed(f"not checked with OpenVINO, or no model.bin: {rep}")


# serve: a real server on a free loopback port, one classification, SIGTERM
@check("serve", "vitkit serve CKPT (POST /v1/classify, then SIGTERM)")
def _serve_real(r: Run) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = r.tmp / "serve.log"  # a file, not a pipe: nothing reads the log while the server runs
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "vitkit", "serve", str(r.ckpt), "--port", str(port),
                                 "--engine-budget", "0.5", "--max-wait-ms", "1"], cwd=r.tmp, env=r.env,
                                stdout=f, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + READY_WITHIN_S
        while True:
            if proc.poll() is not None:
                raise Failed(f"the server exited with code {proc.returncode} before it was ready:\n"
                             f"{tail(log.read_text())}")
            try:
                with urllib.request.urlopen(url + "/readyz", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise Failed(f"not ready within {READY_WITHIN_S:g} s")
            time.sleep(0.2)
        req = urllib.request.Request(url + "/v1/classify?topk=3", data=r.image.read_bytes(), method="POST",
                                     headers={"Content-Type": "image/png"})
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                body = json.loads(resp.read())
        except urllib.error.HTTPError as err:
            raise Failed(f"POST /v1/classify answered {err.code}: {err.read()[:500]!r}") from None
        top = body["results"][0]["top"]
        if len(top) != 3 or not all("label" in t and "prob" in t for t in top):
            raise Failed(f"unexpected answer to /v1/classify: {body}")
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            raise Failed("still running 60 s after SIGTERM") from None
        if code != 0:
            raise Failed(f"exit code {code} after SIGTERM:\n{tail(log.read_text())}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@check("serve", "vitkit serve CKPT --engine onnxruntime (without the onnx extra)")
def _serve_ort(r: Run) -> None:
    r.missing("onnx", "serve", r.ckpt, "--port", str(free_port()), "--engine", "onnxruntime")


@check("serve", "vitkit serve CKPT --engine openvino (without the openvino extra)")
def _serve_ov(r: Run) -> None:
    r.missing("openvino", "serve", r.ckpt, "--port", str(free_port()), "--engine", "openvino")


@check("serve", "vitkit serve CKPT --ray (without Ray Serve)")
def _serve_ray(r: Run) -> None:
    r.missing("ray", "serve", r.ckpt, "--port", str(free_port()), "--ray")


# plots: the commands that draw figures
@check("plots", "vitkit analyze CKPT IMAGE --out DIR")
def _plots_analyze(r: Run) -> None:
    out = r.out("analyze")
    r.ok("analyze", r.ckpt, r.image, "--out", out, "--num-images", "4")
    pngs = ["rollout.png", "attention_distance.png", "posemb_similarity.png", "embedding_filters.png"]
    lacking = [p for p in pngs if not (out / p).is_file()]
    if lacking:
        raise Failed(f"no {', '.join(lacking)} in {out}")


@check("plots", "vitkit train (tiny recipe): curves.png, predictions.png")
def _plots_train(r: Run) -> None:
    out = r.out("train-plots")
    r.ok(*r.train_args(out))
    lacking = [p for p in ("curves.png", "predictions.png") if not (out / p).is_file()]
    if lacking:
        raise Failed(f"no {', '.join(lacking)} in {out}")


@check("plots", "vitkit bench --out DIR: bench.png")
def _plots_bench(r: Run) -> None:
    out = r.out("bench-plots")
    r.ok(*BENCH[:-2], "--peers", "none", "--out", out, "--quiet")
    if not (out / "bench.png").is_file():
        raise Failed(f"no bench.png in {out}")


# bench (and hf, its earlier name): Hugging Face's ViT as a peer, timed
BENCH = ["bench", "Ti/16", "--set", "depth=1", "--img-size", "32", "--batch", "2", "--repeats", "1", "--warmup", "0",
         "--what", "inference", "--no-roofline", "--peers", "hf"]


def _bench_hf(r: Run) -> None:
    res = json.loads(r.ok(*BENCH, "--json"))
    libs = {row.get("library") for row in res.get("rows", [])}
    if "HF" not in libs or any(n.startswith("hf ") for n in res.get("notes", [])):
        raise Failed(f"Hugging Face was not timed: rows of {sorted(map(str, libs))}, notes {res.get('notes')}")


check("bench", "vitkit bench Ti/16 --peers hf")(_bench_hf)
check("hf", "vitkit bench Ti/16 --peers hf")(_bench_hf)


# log: TensorBoard event files of a tiny run
@check("log", "vitkit train --set train.log=[tensorboard]")
def _log_tensorboard(r: Run) -> None:
    out = r.out("train-tb")
    r.ok(*r.train_args(out, "train.log=[tensorboard]"))
    events = list((out / "tensorboard").glob("events.out.tfevents.*"))
    if not events or not all(e.stat().st_size > 0 for e in events):
        raise Failed(f"no TensorBoard event file in {out / 'tensorboard'}")


@check("wandb", "vitkit train --set train.log=[wandb] (offline)")
def _log_wandb(r: Run) -> None:
    out = r.out("train-wandb")
    r.ok(*r.train_args(out, "train.log=[wandb]"))
    if not list((out / "wandb").glob("offline-run-*")):
        raise Failed(f"no offline W&B run in {out / 'wandb'}")


@check("mlflow", "vitkit train --set train.log=[mlflow] (file store)")
def _log_mlflow(r: Run) -> None:
    out = r.out("train-mlflow")
    r.ok(*r.train_args(out, "train.log=[mlflow]"))
    if not (out / "mlflow_run_id").is_file():
        raise Failed(f"no MLflow run in {out}")


# hub: a Hub id downloaded, and a push, against a Hub on 127.0.0.1 (the download tests' server)
@check("hub", "vitkit predict -w OWNER/NAME; vitkit push CKPT OWNER/NAME (a loopback Hub)")
def _hub_loopback(r: Run) -> None:
    from _http_server import COMMIT, FileServer
    from vitkit.checkpoints import load_weights, save_weights
    hf = save_weights(load_weights(r.ckpt), r.tmp / "hf-folder", "hf")
    with FileServer() as server:
        server.repos["acme/vit-tiny-test"] = {p.name: p.read_bytes() for p in hf.iterdir() if p.is_file()}
        env = {"HF_ENDPOINT": server.url, "HF_TOKEN": "hf_test"}
        out = r.ok("predict", "-w", "acme/vit-tiny-test", r.image, "--json", "--no-progress", env=env)
        if not json.loads(out.strip().splitlines()[-1]).get("top"):
            raise Failed(f"no top-k from the Hub model:\n{tail(out)}")
        if not server.requests("/acme/vit-tiny-test/resolve/main/model.safetensors", "GET"):
            raise Failed("the weights were not downloaded from the loopback Hub")
        out = r.ok("push", r.ckpt, "acme/pushed", "--to", "timm", env=env)
        if f"/acme/pushed/commit/{COMMIT}" not in out or "model.safetensors" not in server.repos.get("acme/pushed", {}):
            raise Failed(f"the push did not commit model.safetensors:\n{tail(out)}")


# reproduce: its arms trained, interrupted, resumed and run in parallel at tiny settings, and its statistics
# (the tests that need only the extra; the pilot end to end is the slow tests/test_reproduce_e2e.py)
@check("reproduce", "pytest tests/test_reproduce_stats.py tests/test_reproduce.py (tiny arms, resume, jobs)")
def _reproduce_tests(r: Run) -> None:
    # the signal test runs in the core suite; here it met a resource-tracker warning once in two runs
    tests = ["tests/test_reproduce_stats.py", "tests/test_reproduce.py", "-k", "not stop_at_once"]
    env = {k: v for k, v in os.environ.items() if k != "VITKIT_BACKEND"}  # the suite's own settings (conftest)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *tests], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise Failed(f"pytest exit code {proc.returncode}:\n{tail(proc.stdout + proc.stderr, 40)}")


def free_port() -> int:
    from _serve import free_port as port
    return port()


# --- main ---------------------------------------------------------------------------------------------------
def environment_problems(extra: str) -> List[str]:
    """The environment is not what it should be: the core one imports an extra's package, or an extra's
    own packages do not import (a broken install, not a missing declaration)."""
    if extra == "core":
        present = sorted({m for mods in MODULES.values() for m in mods if importlib.util.find_spec(m)})
        return [f"the core environment has {', '.join(present)}: its expected failures would test nothing"
                ] if present else []
    absent = [m for m in MODULES.get(extra, []) if importlib.util.find_spec(m) is None]
    return [f"the {extra} environment lacks {', '.join(absent)}"] if absent else []


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("extra", choices=sorted(CHECKS), help="the extra this environment holds ('core': none)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (its path is printed)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE))
    bad = environment_problems(args.extra)
    if bad:
        print(f"extras_smoke [{args.extra}]: {'; '.join(bad)} ({sys.prefix})", file=sys.stderr)
        return 1
    tmp = Path(tempfile.mkdtemp(prefix=f"vitkit-extra-{args.extra}-"))
    failed = []
    t_all = time.monotonic()
    try:
        r = Run(args.extra, tmp)
        for shown, fn in CHECKS[args.extra]:
            t0 = time.monotonic()
            try:
                fn(r)
            except Failed as err:
                failed.append(shown)
                print(f"FAIL [{args.extra}] {shown} ({time.monotonic() - t0:.1f} s): {err}", flush=True)
            except Exception:  # noqa: BLE001 - a bug in the check itself: shown, and the other checks still run
                import traceback
                failed.append(shown)
                print(f"FAIL [{args.extra}] {shown} ({time.monotonic() - t0:.1f} s): the check raised\n"
                      f"{traceback.format_exc()}", flush=True)
            else:
                print(f"ok   [{args.extra}] {shown} ({time.monotonic() - t0:.1f} s)", flush=True)
    finally:
        if args.keep:
            print(f"extras_smoke [{args.extra}]: kept {tmp}")
        else:
            import shutil
            shutil.rmtree(tmp, ignore_errors=True)
    n = len(CHECKS[args.extra])
    if failed:
        print(f"extras_smoke [{args.extra}]: {len(failed)} of {n} failed in {sys.prefix}: "
              + "; ".join(failed), file=sys.stderr)
        return 1
    print(f"extras_smoke [{args.extra}]: {n} passed in {time.monotonic() - t_all:.0f} s ({sys.prefix})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
