"""Studies built on the whole op ``mamba3_mimo`` (they are not part of the operator, ``mimo_numerics/ops/mamba3_mimo/``).

* :mod:`.training`: training one Mamba-3 MIMO layer under a policy, with the FP64 gradient at every step
  (``mimo-numerics train-demo``; ``reports/training_under_policy/``).
* :mod:`.report`: the whole-op sections of ``mimo-numerics report --op mamba3_mimo`` (the generic
  ``mimo_numerics.report`` drives it).
* :mod:`.site_ranking`: the one-site-off ranking of the whole op on its golden cases
  (``reports/mamba3_mimo_site_ranking.md``; the ranking itself is ``sensitivity.rank_sites(..., op="mamba3_mimo")``).
* :mod:`.measure`, :mod:`.golden_figures`: measurements of the op against the golden H200 data (tests and
  ``scripts/measure_*.py``).
"""
