"""``python -m bench.load``: the load bench, :mod:`bench.claims.load`, under its first name.

The command is in habits and scripts (docs/performance gives it beside
``python -m bench.claims.load``), and scripts import the module as ``from bench import load``:
importing this module gives :mod:`bench.claims.load` itself, one module under two names.
"""

from __future__ import annotations

import sys

from bench.claims import load

if __name__ == "__main__":
    load.main()
else:
    sys.modules[__name__] = load
