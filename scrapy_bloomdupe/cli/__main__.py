"""``python -m scrapy_bloomdupe.cli``: the ``bloomdupe`` console script."""

import sys

from .run import main

sys.exit(main())
