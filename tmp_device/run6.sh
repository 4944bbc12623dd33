export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python -m pytest -q -x tests/ops/mamba3_mimo_epilogue/test_ordered_sums.py tests/ops/mamba3_mimo/test_cuda_graph_gpu.py 2>&1 | grep -v -i warn | tail -5
timeout 150 python benchmarks/profile_whole_op.py --device cuda --seqlen 8192 --heads 16 --backend triton --rows 45 2>&1 | grep -v -i warn | tail -75
