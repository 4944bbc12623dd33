export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
timeout 60 python -m pytest -q -x tests/ops/mamba3_mimo_epilogue/test_ordered_sums.py 2>&1 | grep -v -i warn | tail -3
timeout 120 python benchmarks/bench_whole_op.py --device cuda --shape a --backend triton --policies upstream_sm90 --warmup 2 --repeats 3 --out $OUT 2>&1 | grep -v -i warn | tail -6
