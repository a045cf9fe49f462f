"""``python -m batched_nerf``: the command line, see :mod:`batched_nerf.cli`."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
