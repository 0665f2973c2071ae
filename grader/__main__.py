"""`python -m grader …`: the instructor command line."""

import sys

from grader.cli import main

sys.exit(main())
