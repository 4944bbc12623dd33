"""The suite's layout: ``tests/`` the generic tools' tests, ``tests/ops/<operator>/`` each operator's, ``tests/studies/``
the studies', ``tests/support/`` the helpers they share (golden files, policies, argument builders), ``tests/data/``
the stored H200 data (its README has the provenance), ``tests/ascend/`` the Ascend compile gate's.

The support modules are imported by name (``import bwd_bwd_support``) from every folder: this puts their folder on
``sys.path`` once, for every way pytest is started (a file, a folder, ``-k``, the mutation check's copied tree).
"""

import sys
from pathlib import Path

SUPPORT = Path(__file__).resolve().parent / "support"
if str(SUPPORT) not in sys.path:
    sys.path.insert(0, str(SUPPORT))
