"""Scale-out on CPU: torchrun with 2 processes (gloo) follows the 1-process loss curve."""
import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from _synthetic import write_npz, write_recipe

# PYTHONFAULTHANDLER: a rank that aborts (seen rarely at exit: "terminate called without an active exception")
# prints its Python stacks into the failure message
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")
# no random augmentation or dropout: the two runs then compute the same global batches
SETTINGS = ["--set", "augment.crop=none", "--set", "augment.erasing=0", "--set", "train.ema=0", "--set",
            "train.log_every=1", "--set", "schedule.steps=32", "--set", "train.eval_every=0", "--set", "optim.lr=0.005",
            "--no-progress"]


def _losses(run):
    return [json.loads(x)["loss"] for x in (run / "metrics.jsonl").read_text().splitlines()
            if json.loads(x)["kind"] == "train"]


def _train(recipe, out, nproc, *extra):
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
                "--standalone"] if nproc > 1 else [sys.executable]
    cmd = launcher + ["-m", "vitkit", "train", "-r", str(recipe), "--out", str(out)] + SETTINGS + list(extra)
    r = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=300)
    assert r.returncode == 0, r.stderr[-8000:]
    return r


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    d = tmp_path_factory.mktemp("dist")
    recipe = write_recipe(d, write_npz(d / "q.npz"))
    _train(recipe, d / "one", 1)
    return d, recipe, _losses(d / "one")


@pytest.mark.parametrize("kind", ["ddp", pytest.param("fsdp", marks=pytest.mark.slow)])
def test_two_processes_match_one(single, kind):
    d, recipe, one = single
    r = _train(recipe, d / kind, 2, "--set", f"train.distributed={kind}")
    two = _losses(d / kind)
    assert len(one) == len(two) == 32
    assert sum(one[-4:]) / 4 < one[0] - 0.01  # the curve moves, so matching it means something
    for a, b in zip(one, two):
        assert abs(a - b) <= 2e-3 * max(1.0, abs(a)), (one, two)
    # only rank 0 wrote the run folder, once
    assert r.stdout.count("test accuracy") == 1
    a = load_file(str(d / "one" / "model" / "model.safetensors"))
    b = load_file(str(d / kind / "model" / "model.safetensors"))
    for k in a:
        assert torch.allclose(a[k], b[k], atol=2e-3, rtol=1e-2), k
    res = json.loads((d / kind / "results.json").read_text())
    assert res["processes"] == 2 and (d / kind / "model" / "model.safetensors").is_file()


def test_the_trainer_is_gone_before_the_process_group(tmp_path, monkeypatch):
    """The trainer and its (DDP/FSDP-wrapped) model are in reference cycles: teardown collects them while the
    interpreter is whole, before it destroys the process group (a wrapper freed at shutdown can abort a rank)."""
    import gc
    import weakref

    import vitkit.train.distributed as D
    import vitkit.train.trainer as T
    from vitkit.train.recipe import load_recipe

    recipe = load_recipe(write_recipe(tmp_path, write_npz(tmp_path / "q.npz")),
                         {"schedule.steps": 8, "train.eval_every": 0})
    made, seen = [], []
    init = T.Trainer.__init__

    def tracked(self, *a, **k):
        init(self, *a, **k)
        made.extend([weakref.ref(self), weakref.ref(self.run.model)])

    monkeypatch.setattr(T.Trainer, "__init__", tracked)
    leaving = []  # a process group exists as far as teardown can tell, and only there
    monkeypatch.setattr(D.dist, "is_initialized", lambda: bool(leaving))
    monkeypatch.setattr(D.dist, "destroy_process_group", lambda: seen.append([r() is None for r in made]))
    teardown = D.teardown
    monkeypatch.setattr(D, "teardown", lambda: (leaving.append(1), teardown()))
    gc.disable()  # no collection by chance: only teardown's
    try:
        T.train(recipe, tmp_path / "run", progress=False)
    finally:
        gc.enable()
    assert len(made) == 2 and seen == [[True, True]]
