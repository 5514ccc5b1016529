"""`python -m rankscope.cli`: the same as the `rankscope` command."""

import sys

from ._main import main

sys.exit(main())
