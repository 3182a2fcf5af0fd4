"""`python -m bench.capacity`: with the project's virtualenv (`make venv`), re-executing itself
there if started otherwise, then bench/capacity/run.py's main."""

import sys

from bench.runs import use_repo_venv

use_repo_venv("bench.capacity")

from bench.capacity.run import main  # noqa: E402

sys.exit(main(sys.argv[1:]))
