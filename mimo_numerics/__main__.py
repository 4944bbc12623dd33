"""``python -m mimo_numerics``: the ``mimo-numerics`` command line (see ``mimo_numerics.cli``)."""

import sys

from .cli import main

sys.exit(main())
