"""`python -m pytriton` runs the `pytriton` command."""

import sys

from pytriton.cli import main

sys.exit(main())
