"""The README as a new user reads it: its whole-op snippet runs as written (it failed with `element 0 of tensors
does not require grad`), and the sections say how to install what they use."""

import re
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
#: The sentence that introduces the README's runnable whole-op block.
RUNNABLE_MARK = "`tests/test_newcomer_readme.py` runs this block"


def _readme() -> str:
    return (ROOT / "README.md").read_text(encoding="utf-8")


def _block_after(text: str, mark: str) -> str:
    """The first fenced code block after ``mark``."""
    start = text.index(mark)
    match = re.compile(r"```[a-z]*\n(.*?)```", re.DOTALL).search(text, start)
    assert match, f"no code block after {mark!r}"
    return match.group(1)


def _section(text: str, heading: str) -> str:
    start = text.index(f"## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def test_readme_whole_op_block_runs_as_written(capsys):
    code = _block_after(_readme(), RUNNABLE_MARK)
    assert "requires_grad_()" in code and "OP_INPUT_NAMES" in code and "make_op_inputs" in code
    namespace = {}
    exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102 - the README's own code
    args, args64 = namespace["args"], namespace["args64"]
    assert len(args) == 14
    assert args[0].grad is not None and args[0].grad.dtype == torch.bfloat16
    assert all(a.grad.dtype == torch.float64 for a in args64 if a is not None)
    printed = float(capsys.readouterr().out.strip().splitlines()[-1])
    assert 0 < printed < 1e-1  # a bf16 policy's rel RMS error against the FP64 truth


def test_readme_gating_section_says_how_to_install_pytest():
    gating = _section(_readme(), "Gating your kernel in pytest")
    assert 'pip install -e ".[dev]"' in gating or "pip install pytest" in gating


def test_readme_says_how_to_run_the_notebooks_headless():
    notebooks = _section(_readme(), "Notebooks")
    assert "jupyter nbconvert --to notebook --execute" in notebooks
