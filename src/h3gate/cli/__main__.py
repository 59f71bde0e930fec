"""``python -m h3gate.cli``: the ``h3gate`` command."""

import sys

from h3gate.cli import main

sys.exit(main())
