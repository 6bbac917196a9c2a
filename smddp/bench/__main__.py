"""``python -m smddp.bench``: the same as the ``smddp-bench`` command."""

import sys

from smddp.bench.cli import main

# Spawned ranks import this module again as __mp_main__; only the launching
# process may run the command.
if __name__ == "__main__":
    sys.exit(main())
