export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
timeout 300 python tmp_device/sweep.py a,d 2>&1 | grep -v Warn
timeout 250 python -m pytest -q -x tests/ops/mamba_mimo_bwd_bwd/test_bwd_bwd_kernels_gpu.py 2>&1 | tail -5
