"""``python -m jaxroll``: the ``jaxroll`` command."""

import sys

from .cli import main

sys.exit(main())
