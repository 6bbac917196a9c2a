"""``python -m smddp.cluster``: the same as the ``smddp-cluster`` command."""

import sys

from smddp.cluster.cli import main

if __name__ == "__main__":
    sys.exit(main())
