"""``python -m app.cli``: the ``carryover`` command, run from a checkout."""

import sys

from app.cli import main

sys.exit(main())
