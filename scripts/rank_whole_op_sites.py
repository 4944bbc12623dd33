#!/usr/bin/env python
"""Write ``reports/mamba3_mimo_site_ranking.md`` (+ ``.json``, ``.png``): the one-site-off ranking of the whole op's
roundings on its golden cases. The generator is ``mimo_numerics.studies.site_ranking`` (``--help`` for the options;
``--smoke`` for one small drawn case)."""

import sys

from mimo_numerics.studies.site_ranking import main

if __name__ == "__main__":
    sys.exit(main())
