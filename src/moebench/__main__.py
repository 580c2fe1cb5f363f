"""`python -m moebench ...`: the `moebench` command where its console script is not installed (a source
tree on a lent GPU machine: PYTHONPATH=src python3 -m moebench aa ...)."""

import sys

from moebench.cli.main import main

sys.exit(main())
