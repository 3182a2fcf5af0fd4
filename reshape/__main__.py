"""`python -m reshape`: the same command line as `reshape`."""

import sys

from reshape.cli import main

sys.exit(main())
