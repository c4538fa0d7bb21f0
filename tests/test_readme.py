"""The README is a landing page that tells the truth: its Python snippets run as shown (with small generated
weights where the real ones come from a hub), the closing lines it shows are what the commands print, the
extras it lists are pyproject.toml's, and neither it nor the docs refer to the tracker."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from test_extras import EXTRAS  # pyproject.toml's extras, read once (tomllib, or tomli before Python 3.11)

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
TRACKER = re.compile(r"\bissues? #?[0-9]+|the issue (asked|says|wants)", re.I)


def blocks(lang: str):
    return re.findall(rf"^```{lang}\n(.*?)^```", README, flags=re.M | re.S)


def test_the_readme_is_short_and_has_the_landing_sections():
    assert len(README.splitlines()) <= 210
    for heading in ("## Install", "## The two commands", "## In Python", "## Documentation", "## Citation",
                    "## License"):
        assert heading in README
    assert "--index-url https://download.pytorch.org/whl/cpu" in README


def test_no_tracker_references_in_readme_changelog_or_docs():
    docs = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]
    bad = [f"{p.relative_to(ROOT)}:{i}: {line.strip()[:80]}" for p in docs
           for i, line in enumerate(p.read_text().splitlines(), 1) if TRACKER.search(line)]
    assert not bad, "say what the thing is, not which tracker entry asked for it:\n" + "\n".join(bad)
    assert TRACKER.search("as issue 19 asked") and TRACKER.search("the issue asked for a page")


def _anchors(doc: Path):
    """GitHub's anchors of a markdown file's headings: lower case, punctuation dropped, spaces as hyphens."""
    heads = re.findall(r"^#+ (.+)$", doc.read_text(), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


@pytest.mark.parametrize("doc", ["README.md", "CONTRIBUTING.md", "docs/results.md", "docs/performance.md",
                                 "docs/performance-results.md"])
def test_relative_links_point_into_the_tree(doc):
    path = ROOT / doc
    links = re.findall(r"\]\(([^)\s]+)\)", path.read_text())
    local = [link for link in links if not re.match(r"[a-z]+://", link)]
    bad = []
    for link in local:
        target, _, anchor = link.partition("#")
        file = (path.parent / target).resolve() if target else path
        if not file.exists():
            bad.append(link)
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            bad.append(link)
    assert not bad, f"{doc} links to paths or headings that are not in the tree: {bad}"
    assert doc != "README.md" or len(local) > 10


def test_demo_closing_lines_are_what_train_prints_for_the_measured_run(tmp_path, monkeypatch, capsys):
    from vitkit.cli.train import print_report

    shown = README.split("`make demo` trains", 1)[1].split("```\n", 1)[1].split("```", 1)[0]
    measured = json.loads((ROOT / "docs" / "figures" / "training" / "fmnist-demo.json").read_text())
    if "closing_lines" in measured:  # runs of benchmarks/make_demo.py since it keeps them: the log itself
        assert shown == "\n".join(measured["closing_lines"]) + "\n"
    res = measured["results"]
    run = tmp_path / "runs" / "demo"
    (run / "model").mkdir(parents=True)
    for name in ("curves.png", "predictions.png", "metrics.jsonl", "results.json"):
        (run / name).write_text("")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RANK", raising=False)
    print_report(res, Path("runs/demo"))
    assert capsys.readouterr().out == shown


def test_the_commands_listed_are_the_cli_s():
    out = subprocess.run([sys.executable, "-m", "vitkit", "--help"], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"}).stdout
    block = out.split("  COMMAND\n", 1)[1].split("\noptions:", 1)[0]
    commands = re.findall(r"^    (\S+)", block, flags=re.M)
    listed = re.findall(r"`([a-z0-9-]+)`", README.split("`vitkit --help` lists the commands (", 1)[1].split(")", 1)[0])
    assert len(commands) > 15 and listed == commands


def test_info_block_is_what_vitkit_info_prints():
    shown = README.split("`vitkit info B/16` prints:", 1)[1].split("```\n", 1)[1].split("```", 1)[0]
    out = subprocess.run([sys.executable, "-m", "vitkit", "info", "B/16"], capture_output=True, text=True,
                         check=True, env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"}).stdout
    assert out == shown


def test_every_extra_is_listed_and_what_all_leaves_out_is_true():
    install = README.split("## Install", 1)[1].split("\n## ", 1)[0]
    extras = EXTRAS
    unlisted = [e for e in extras if f"`{e}`" not in install]
    assert not unlisted, f"extras in pyproject.toml the README does not list: {unlisted}"

    def names(reqs):
        return {re.split(r"[<>=\[ ]", r, maxsplit=1)[0].lower() for r in reqs}

    everyday = names(extras["all"])
    outside = sorted(e for e, reqs in extras.items() if e not in ("all", "test") and not names(reqs) <= everyday)
    said = re.search(r"it leaves out ((?:`\w+`(?:, | and )?)+)", install.replace("\n", " ")).group(1)
    assert sorted(re.findall(r"`(\w+)`", said)) == outside


def test_citation_names_this_version():
    from vitkit import __version__
    bib = blocks("bibtex")[0]
    assert f"version = {{{__version__}}}" in bib and "arxiv.org/abs/2010.11929" in bib


def _weights_for(tmp_path: Path):
    """Stand-ins for the hub weights the snippets name: the same architectures, random, in the same layouts."""
    import vitkit
    made = {}
    for name, to in (("vit_b_16", "torchvision"), ("vit_small_patch16_224", "timm")):
        torch.manual_seed(0)
        path = tmp_path / f"{name}.pth"
        vitkit.save_weights(vitkit.create_model(name), path, to=to)
        made[name] = path
    return made


@pytest.mark.slow
def test_python_snippets_run_as_shown(tmp_path, monkeypatch):
    from PIL import Image

    snippets = blocks("python")
    assert len(snippets) == 3
    made = _weights_for(tmp_path)
    Image.effect_mandelbrot((320, 240), (-2, -1.2, 1, 1.2), 100).convert("RGB").save(tmp_path / "chelsea.png")
    monkeypatch.chdir(tmp_path)
    for code in snippets:
        for name, path in made.items():  # the one change: local weights instead of the download
            code = code.replace(f'"{name}", pretrained=True', f'"{name}", weights={str(path)!r}')
        assert "pretrained=True" not in code.split("#")[0]
        scope = {}
        exec(compile(code, "README.md", "exec"), scope)  # noqa: S102 - the README's own code
        if "preds" in scope:
            assert len(scope["preds"][0].top) == 3
        if "maps" in scope:
            assert scope["tokens"].shape == (2, 197, 384) and scope["pooled"].shape == (2, 384)
            assert [m.shape for m in scope["maps"]] == [(2, 384, 14, 14)] * 2
            assert len(scope["attn"]) == 12 and scope["attn"][0].shape == (2, 6, 197, 197)
        if "loss" in scope:
            assert scope["model"].config.img_size in (384, (384, 384)) and scope["model"].config.num_classes == 10
            assert torch.isfinite(scope["loss"])
