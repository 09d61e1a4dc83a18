"""``python3 -m fleet_runner``: run the command line."""

import sys

from fleet_runner.cli import main

sys.exit(main())
