"""What a new user hit with policy files: `policy show NAME > p.json` must give a file the package loads, and
`RoundingPolicy.from_json` given a file name must say that it takes JSON text and which function loads a file."""

import pytest

from mimo_numerics import cli, presets
from mimo_numerics.policy import RoundingPolicy


def test_policy_show_redirected_to_a_file_is_a_policy_file(tmp_path, capsys):
    assert cli.main(["policy", "show", "upstream_sm90"]) == 0
    captured = capsys.readouterr()
    path = tmp_path / "p.json"
    path.write_text(captured.out, encoding="utf-8")  # what `> p.json` keeps: stdout only
    assert presets.resolve(str(path)) == presets.get("upstream_sm90")
    assert RoundingPolicy.from_json(captured.out) == presets.get("upstream_sm90")
    assert "upstream_sm90" in captured.err  # which policy it is: on stderr, off the file


def test_policy_show_of_a_file_round_trips(tmp_path, capsys):
    path = tmp_path / "custom.json"
    policy = presets.get("upstream_sm90").replace(diag_mode="mul_then_add")
    path.write_text(policy.to_json(), encoding="utf-8")
    assert cli.main(["policy", "show", str(path)]) == 0
    again = tmp_path / "again.json"
    again.write_text(capsys.readouterr().out, encoding="utf-8")
    assert presets.resolve(again) == policy


def test_from_json_given_a_file_name_names_the_file_loader(tmp_path):
    with pytest.raises(ValueError, match=r"takes the JSON text.*'p\.json'.*presets\.resolve"):
        RoundingPolicy.from_json("p.json")
    with pytest.raises(TypeError, match=r"JSON text.*presets\.resolve"):
        RoundingPolicy.from_json(tmp_path / "p.json")


def test_a_file_with_the_old_name_line_is_refused_with_the_fix(tmp_path):
    path = tmp_path / "old.json"
    path.write_text("# upstream_sm90: preset 'upstream_sm90'\n" + presets.get("upstream_sm90").to_json())
    with pytest.raises(ValueError, match=r"old\.json.*'#' line.*delete that line"):
        presets.resolve(str(path))


def test_readme_names_the_file_loader():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    assert "presets.resolve(" in text and "policy show upstream_sm90 > " in text
