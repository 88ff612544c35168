"""``python -m headwise.cli``: the same as the ``headwise`` command."""

import sys

from . import main

sys.exit(main())
