"""``python -m batched_nerf``: the command line, see [`batched_nerf.cli`][batched_nerf.cli]."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
