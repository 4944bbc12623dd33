"""Stage-2 tile sweep on CUDA: per launch ms for several (rows, tokens, warps) plans at shapes a and d."""
import sys, json
import torch
sys.path.insert(0, "benchmarks")
from triton.testing import do_bench
import mimo_numerics as mn
from mimo_numerics.benchmark_cases import kernel_shape
from mimo_numerics.kernels import mimo_bwd_bwd
from bench_bwd_bwd_kernel import stage2_inputs, _args, _kw
plans = [(64, 16, 4), (32, 16, 4), (16, 16, 4), (32, 16, 8), (64, 16, 8), (16, 16, 2), (32, 8, 4)]
for shape in sys.argv[1].split(","):
    x = stage2_inputs(kernel_shape(shape), torch.device("cuda"))
    pol = mn.presets.get("upstream_sm90")
    for br, bt, nw in plans:
        prep = mimo_bwd_bwd.build_launches(*_args(x), **_kw(x), policy=pol, tiles=mimo_bwd_bwd.Stage2Tiles(br, bt, nw))
        for la in prep.launches:
            la.run()
        torch.cuda.synchronize()
        per = {la.name: round(do_bench(la.run, rep=50), 3) for la in prep.launches}
        tot = do_bench(lambda: [la.run() for la in prep.launches], rep=50)
        print(shape, (br, bt, nw), f"total {tot:.3f}", json.dumps(per), flush=True)
