"""What a new user hit with `train-demo`: no defaults in `--help`, and a default output folder that, run from the
repository root, overwrote the committed report `reports/training_under_policy/`."""

from pathlib import Path

import pytest

from mimo_numerics import cli
from mimo_numerics.studies import training


def _help(capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train-demo", "--help"])
    assert exit_info.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_train_demo_help_shows_the_defaults_and_the_program(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # argparse wraps at hyphens too: one line per option
    text = _help(capsys)
    assert text.startswith("usage: mimo-numerics train-demo ")
    for default in ("(default: 200)", "(default: [0, 1, 2])", "(default: 0.02)", "(default: cpu)",
                    "(default: 1)"):
        assert default in text, default
    assert "out/train-demo/<UTC yyyymmdd_HHMMSS>" in text


def test_train_demo_default_output_is_a_fresh_folder_outside_reports(monkeypatch, tmp_path):
    seen = {}

    def fake_train_demo(out_dir, **kwargs):
        seen["out"] = out_dir
        return {"files": []}

    monkeypatch.setattr(training, "train_demo", fake_train_demo)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train-demo", "--steps", "1"]) == 0
    out = Path(seen["out"])
    assert out.parts[:2] == ("out", "train-demo") and len(out.parts) == 3
    assert not out.exists()  # a new folder: nothing written there before this run
    assert "reports" not in out.parts
    assert cli.main(["train-demo", "--steps", "1", "--out", "reports/training_under_policy"]) == 0
    assert seen["out"] == "reports/training_under_policy"  # the committed report, only when asked for
