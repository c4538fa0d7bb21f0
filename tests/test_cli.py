import json
import subprocess
import sys

from vitkit.cli import main
from vitkit.smoke import run_smoke


def test_smoke_facts():
    lines = []
    facts = run_smoke(echo=lines.append)
    assert facts["patch embeddings"] == [2, 64, 64]
    assert facts["tokens"] == [2, 65, 64]
    assert facts["logits"] == [2, 10]
    assert facts["update1"]["head_change"] > 0 and facts["update1"]["backbone_change"] == 0
    assert facts["update2"]["backbone_change"] > 0
    assert facts["pos_embed"] == [[1, 65, 64], [1, 145, 64]]
    assert facts["logits at 48 px"] == [2, 10]
    assert any("8x8 -> 12x12" in line for line in lines)


def test_smoke_command_as_a_process():
    out = subprocess.run([sys.executable, "-m", "vitkit", "smoke"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for shape in ("[2, 64, 64]", "[2, 65, 64]", "[2, 10]", "[1, 145, 64]"):
        assert shape in out.stdout
    assert "smoke ok" in out.stdout


def test_info_b16(capsys):
    assert main(["info", "B/16"]) == 0
    out = capsys.readouterr().out
    assert "86,567,656" in out and "17.56 GMACs" in out and "35.13 GFLOPs" in out and "tokens           197" in out


def test_info_json_and_overrides(capsys):
    assert main(["info", "vit_base_patch16_224", "--img-size", "384", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["tokens"] == 577 and row["grid"] == [24, 24] and row["params"] == 86_859_496
    assert main(["info", "S/16", "--set", "posemb=sincos2d", "--set", "num_classes=10", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["params"] == 22_050_664 - 197 * 384 - 990 * 384 - 990  # no learned table, 10-class head
    # "none" is the name of a kind, not null, for a field that takes names (the position embedding here)
    assert main(["info", "S/16", "--set", "posemb=none", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["params"] == 22_050_664 - 197 * 384
    assert main(["recipes", "fmnist-fast", "--set", "model.posemb=none"]) == 0
    assert "posemb: none" in capsys.readouterr().out


def test_info_default_lists_paper_models(capsys):
    assert main(["info", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["model"] for r in rows][:3] == ["Ti/16", "S/32", "S/16"]
    assert {r["model"]: r["params"] for r in rows}["H/14"] == 632_045_800


def test_cli_errors_are_one_clear_line(capsys):
    assert main(["info", "B/17x"]) == 1
    err = capsys.readouterr().err
    assert "unknown model name 'B/17x'" in err and "Traceback" not in err
    assert main(["info", "B/16", "--set", "depth"]) == 2  # a usage error
    assert "--set expects key=value" in capsys.readouterr().err
    assert main(["no-such-command"]) == 2  # usage errors: exit code 2
