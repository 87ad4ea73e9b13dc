"""``python -m aithermctl`` → :func:`aithermctl.cli.main`."""

import sys

from aithermctl.cli import main

sys.exit(main())
