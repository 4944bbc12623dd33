"""The scripts that measure the GPU itself (tensor cores, MUFU) refuse to run without CUDA, with exit code 2 and a
message: their figures come from hardware only (Triton's interpreter has neither)."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
@pytest.mark.parametrize("script,args", [("check_tensor_core_model.py", []), ("fit_mufu_models.py", ["--out", "unused"])])
def test_hardware_scripts_need_cuda(script, args, tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / script), *args], capture_output=True, text=True,
                          cwd=tmp_path)
    assert done.returncode == 2 and "needs a CUDA GPU" in done.stderr, done.stderr
