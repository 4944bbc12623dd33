#!/usr/bin/env python
"""Train one Mamba-3 MIMO layer under several rounding policies from the same initial weights, with the FP64
gradient of the same weights at every step (``mimo_numerics/ops/mamba3_mimo/training.py``, ``docs/whole_op.md``).

Usage::

    python scripts/train_demo.py [--out reports/training_under_policy] [--steps 200] [--seeds 0 1 2]
        [--policy fp64 --policy upstream_sm90 ...] [--device cpu|cuda] [--realistic] [--threads 1] [--no-plots]

Writes ``results.json`` (per-step losses and gradient errors), ``loss.png``, ``grad_error.png``,
``grad_error_per_param.png`` and ``README.md`` to the output folder. The default (CPU, small shapes, 4 policies x 3
seeds x 200 steps) takes a few minutes on 2 cores. ``--device cuda --realistic`` uses shapes near upstream's tested
ones (N = P = 64, R = 4, C = 16, S = 512).
"""

from __future__ import annotations

import sys

from mimo_numerics.ops.mamba3_mimo.training import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
