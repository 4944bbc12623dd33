set -x
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
. scripts/use_upstream_wheels.sh wheelhouse /tmp/site || exit 3
nvidia-smi --query-gpu=name --format=csv
timeout 420 python benchmarks/bench_bwd_bwd_kernel.py --shapes a,d,t --rep 100 --out $OUT 2>&1 | grep -v Warning | tail -8
timeout 120 python benchmarks/profile_whole_op.py --device cuda --seqlen 8192 --heads 16 --backend triton --rows 30 2>&1 | tail -70
