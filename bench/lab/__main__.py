"""`python -m bench.lab`: with the project's virtualenv (`make venv`), re-executing itself
there if started otherwise, then bench/lab/cli.py's main."""

import sys

from bench.runs import use_repo_venv

use_repo_venv("bench.lab")

from bench.lab.cli import main  # noqa: E402

sys.exit(main(sys.argv[1:]))
