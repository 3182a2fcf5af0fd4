"""`python -m bench.queueing`: with the project's virtualenv (`make venv`), re-executing itself
there if started otherwise, then bench/queueing/run.py's main."""

import sys

from bench.runs import use_repo_venv

use_repo_venv("bench.queueing")

from bench.queueing.run import main  # noqa: E402

sys.exit(main(sys.argv[1:]))
