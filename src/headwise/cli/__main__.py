"""``python -m headwise.cli``: the same as the ``headwise`` command (and ``python -m headwise``)."""

import sys

from . import main

sys.exit(main())
