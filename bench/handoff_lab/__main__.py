"""``python -m bench.handoff_lab``: the pull vs push KV hand-off lab (``bench.handoff_lab.run``)."""

from __future__ import annotations

import sys

from bench.handoff_lab.run import main

sys.exit(main())
