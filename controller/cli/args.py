"""What the verbs' parsers share: the type of the sub-command set each verb adds itself to."""

from __future__ import annotations

from typing import Any

SubParsers = Any  # argparse's _SubParsersAction is private
