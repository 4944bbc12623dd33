export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
. scripts/use_upstream_wheels.sh wheelhouse /tmp/site >/dev/null || exit 3
timeout 560 python benchmarks/bench_bwd_bwd_kernel.py --shapes a,d,t --rep 100 --out $OUT 2>&1 | grep -v -i warn | grep -v TileLang | tail -4
