export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
. scripts/use_upstream_wheels.sh wheelhouse /tmp/site >/dev/null || exit 3
timeout 240 python -m pytest -q -x -s tests/ops/mamba3_mimo/test_whole_op_kernels_gpu.py 2>&1 | grep -v -i warn | tail -25
timeout 280 python benchmarks/bench_whole_op.py --device cuda --shape d --backend triton --policies upstream_sm90 --upstream --out $OUT 2>&1 | grep -v -i warn | grep -v TileLang | tail -6
