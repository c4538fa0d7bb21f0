"""vitkit reproduce --state: a campaign's portable state. What it keeps (records always, weights only where a
run still to come needs them), that a campaign stopped on one machine goes on from it on another, and that a
damaged or hostile archive is refused before anything is written."""
import io
import json
import tarfile

import pytest

from test_reproduce import tiny_budget, tiny_data  # noqa: F401 (a fixture)
from vitkit.errors import DataError
from vitkit.reproduce import arms_table, reproduce, runs
from vitkit.reproduce.state import load_state, save_state, weights_to_keep


def _run(root, name, seed, measured=True, checkpoint=False):
    f = runs.run_folder(root, name, seed)
    (f / "model").mkdir(parents=True)
    (f / "model" / "vitkit.json").write_text("{}")
    (f / "model" / "model.safetensors").write_bytes(b"w" * 100)
    for n in ("results.json", "provenance.json", "recipe.yaml", "metrics.jsonl"):
        (f / n).write_text(json.dumps({"code": {"commit": "abc", "dirty": False}}) if n == "provenance.json" else "{}")
    if measured:
        (f / "measures.json").write_text("{}")
    if checkpoint:
        (f / "checkpoints").mkdir()
        (f / "checkpoints" / "last.pt").write_bytes(b"c" * 50)
    (f / ".results.json.tmp").write_text("left by a killed write")
    (f.parent / f"{f.name}.lock").write_text("")
    return f


def _names(path):
    with tarfile.open(path) as tar:
        return sorted(m.name for m in tar.getmembers())


def test_the_state_keeps_records_and_only_the_weights_still_needed(tmp_path):
    root = tmp_path / "out"
    arms = arms_table()
    done = _run(root, "vit", 0)                           # measured, no child: weights dropped
    parent = _run(root, "res-pre20", 0)                   # its child below is not measured yet: kept
    _run(root, "res-ft28-reinit", 0, measured=False, checkpoint=True)  # interrupted: kept whole
    init = runs.init_folder(arms["res-ft28-reinit"], 0, root)
    init.mkdir(parents=True)
    (init / "model.safetensors").write_bytes(b"i")
    timed = _run(root, "axial", 0, checkpoint=True)       # timed at the end: its model kept, not its checkpoint
    (timed / "curves.png").write_bytes(b"p")              # a plot, drawn again from metrics.jsonl
    stale = runs.init_folder(arms["res-ft28-reinit"], 1, root)  # a finished child's starting weights: dropped
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"i")
    keep = weights_to_keep(root, [("vit", 0), ("res-ft28-reinit", 0)], arms, timed=["axial"])
    assert keep >= {parent, runs.run_folder(root, "res-ft28-reinit", 0), init, runs.run_folder(root, "axial", 0)}
    assert done not in keep
    info = save_state(root, tmp_path / "state.tar.gz", keep)
    names = _names(tmp_path / "state.tar.gz")
    assert "runs/vit/seed0/model/vitkit.json" in names and "runs/vit/seed0/measures.json" in names
    assert "runs/vit/seed0/model/model.safetensors" not in names
    assert "runs/res-pre20/seed0/model/model.safetensors" in names
    assert "runs/res-ft28-reinit/seed0/checkpoints/last.pt" in names
    assert "runs/res-ft28-reinit/seed0-init/model.safetensors" in names
    assert "runs/axial/seed0/model/model.safetensors" in names
    assert "runs/axial/seed0/checkpoints/last.pt" not in names and "runs/axial/seed0/metrics.jsonl" in names
    assert not any("seed1-init" in n or n.endswith((".lock", ".tmp", ".png")) for n in names)
    assert info["weight_files"] == 5 and info["finished_runs"] == 4
    # the same state gives the same bytes (fixed times and owners): a commit of it changes only with the runs
    first = (tmp_path / "state.tar.gz").read_bytes()
    save_state(root, tmp_path / "state.tar.gz", keep)
    assert (tmp_path / "state.tar.gz").read_bytes() == first
    # restored elsewhere: a measured run reads as done (reused, not retrained) without its weights
    other = tmp_path / "other"
    got = load_state(tmp_path / "state.tar.gz", other)
    assert got["restored"] == len(names) and got["code_versions"] == ["abc"]
    assert runs.is_done(runs.run_folder(other, "vit", 0))
    # a file already there wins (the folder may be further on than the state)
    (runs.run_folder(other, "vit", 0) / "measures.json").write_text('{"newer": 1}')
    assert load_state(tmp_path / "state.tar.gz", other)["restored"] == 0
    assert json.loads((runs.run_folder(other, "vit", 0) / "measures.json").read_text()) == {"newer": 1}


def _archive(path, entries):
    with tarfile.open(path, "w:gz") as tar:
        for name, kind in entries:
            info = tarfile.TarInfo(name)
            if kind == "link":
                info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
                tar.addfile(info)
            else:
                info.size = 2
                tar.addfile(info, io.BytesIO(b"{}"))
    return path


@pytest.mark.parametrize("entries, says", [
    ([("runs/a/seed0/results.json", "file"), ("runs/../../evil.py", "file")], "outside the runs/ folder"),
    ([("/tmp/evil.py", "file")], "outside the runs/ folder"),
    ([("notes.txt", "file")], "outside the runs/ folder"),
    ([("runs/a/seed0/model", "link")], "a link"),
])
def test_a_hostile_state_is_refused_before_anything_is_written(tmp_path, entries, says):
    path = _archive(tmp_path / "bad.tar.gz", entries)
    with pytest.raises(DataError, match=says) as err:
        load_state(path, tmp_path / "out")
    assert "\n" not in str(err.value)
    assert not (tmp_path / "out").exists() and not (tmp_path / "evil.py").exists()


def test_a_damaged_state_is_one_clear_error(tmp_path):
    good = _archive(tmp_path / "good.tar.gz", [("runs/a/seed0/results.json", "file")])
    for name, data in (("cut.tar.gz", good.read_bytes()[:30]), ("text.tar.gz", b"not an archive")):
        (tmp_path / name).write_bytes(data)
        with pytest.raises(DataError, match="not a readable campaign state"):
            load_state(tmp_path / name, tmp_path / "out")


def test_a_campaign_stopped_on_one_machine_goes_on_from_its_state_on_another(tmp_path, tiny_data):  # noqa: F811
    """Claim 5 (a pre-training and fine-tunes from it): stopped right after the parent finished, the state
    carries the parent's weights; a fresh folder given only the state trains the fine-tunes from them without
    retraining the parent, and ends with the report of an uninterrupted campaign."""
    budget = tiny_budget(tiny_data)
    state = tmp_path / "state.tar.gz"

    class Stop(KeyboardInterrupt):
        pass

    def stop_after_first(line):
        if " done (" in line:
            raise Stop()
    with pytest.raises(Stop):
        reproduce(tmp_path / "first", [5], budget, log=stop_after_first, state=state)
    parent_weights = [n for n in _names(state) if n.startswith("runs/res-pre20") and n.endswith(".safetensors")]
    assert parent_weights  # the fine-tunes still to come need them
    lines = []
    rep = reproduce(tmp_path / "second", [5], budget, log=lines.append, state=state)
    assert any("files restored" in x for x in lines)
    assert any(x.startswith("[") and "res-pre20" in x and x.endswith("seed 0: reused") for x in lines), lines
    assert not any(x.startswith("[") and "res-pre20" in x and "seed 0: training" in x for x in lines), lines
    whole = reproduce(tmp_path / "whole", [5], budget, log=lambda s: None)
    assert _accuracies(rep) == _accuracies(whole)
    # finished: no run needs the parent any more, so the state drops its weights and keeps its records
    final = _names(state)
    assert not any(n.startswith("runs/res-pre20") and n.endswith(".safetensors") for n in final)
    assert any(n.startswith("runs/res-pre20") and n.endswith("/seed0/measures.json") for n in final)


def _accuracies(report):
    return {arm: {m: v for m, v in d.items() if m in ("test_top1", "val_top1")} for arm, d in report["values"].items()}
