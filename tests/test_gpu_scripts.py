"""The scripts that measure the GPU itself (tensor cores, MUFU) refuse to run without CUDA, with exit code 2 and a
message: their figures come from hardware only (Triton's interpreter has neither)."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
@pytest.mark.parametrize("script,args", [("check_tensor_core_model.py", []), ("fit_mufu_models.py", ["--out", "unused"]),
                                         ("check_cuda_sigmoid.py", ["--out", "unused.md"])])
def test_hardware_scripts_need_cuda(script, args, tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / script), *args], capture_output=True, text=True,
                          cwd=tmp_path)
    assert done.returncode == 2 and "needs a CUDA GPU" in done.stderr, done.stderr


def test_the_cuda_sigmoid_check_smoke_run_compares_nothing_on_the_cpu(tmp_path):
    """``--device cpu``: the models' distance from the correctly rounded functions, no claim about the GPU."""
    out = tmp_path / "s.md"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_cuda_sigmoid.py"), "--device", "cpu",
                           "--stride", str((1 << 20) + 1), "--out", str(out)], capture_output=True, text=True,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert text.count("not compared (no CUDA)") == 2 and "4096 float32 bit patterns" in text
