"""``python -m controller.cli``: the same as the ``pdctl`` console script."""

import sys

from controller.cli.commands import main

sys.exit(main())
