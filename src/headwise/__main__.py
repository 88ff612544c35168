"""``python -m headwise``: the same as the ``headwise`` command."""

import sys

from .cli import main

sys.exit(main())
