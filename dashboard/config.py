"""Where the console finds its controller: URL, state directory, API token, refresh interval.

Read from the script's own arguments (``streamlit run app.py -- --controller URL --state-dir
DIR --prometheus URL --token-file FILE``) first, then the environment (``PDCTL_URL``,
``PDCTL_STATE_DIR``, ``PDCTL_PROMETHEUS_URL``, ``PDCTL_TOKEN``, ``PDCTL_TOKEN_FILE``,
``PDCTL_CONSOLE_REFRESH_S``), then the defaults. A console for viewers is given the viewer
token (``--token-file STATE_DIR/viewer-token``): the controller refuses its changes (403) and
the console offers none.
No Streamlit import.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pdctl_api.client import DEFAULT_STATE_DIR, DEFAULT_URL, read_token

DEFAULT_REFRESH_S = 2.0
CACHE_TTL_S = 0.8  # how long a read is shared: shorter than the refresh, never stale
RECENT_LIMIT = 200  # requests in the Overview's recent-requests chart


def step_for(window_s: float) -> float:
    """The timeseries bucket for a window: about 60 buckets, never below 1 s."""
    return max(1.0, window_s / 60.0)


@dataclass(frozen=True)
class ConsoleConfig:
    controller_url: str = DEFAULT_URL
    state_dir: Path = DEFAULT_STATE_DIR
    env_token: str | None = None
    refresh_s: float = DEFAULT_REFRESH_S
    prometheus_url: str | None = None  # time-series panels from Prometheus when set
    token_file: Path | None = None  # default: STATE_DIR/token

    @property
    def token_path(self) -> Path:
        return self.token_file or self.state_dir / "token"

    def token(self) -> tuple[str | None, str]:
        """The API token and where it came from (``PDCTL_TOKEN`` wins over the file).

        Read on every call: the controller may create the file after the console starts.
        """
        if self.env_token:
            return self.env_token, "the PDCTL_TOKEN environment variable"
        if self.token_file is not None:
            try:
                return self.token_file.read_text().strip() or None, str(self.token_file)
            except OSError:
                return None, str(self.token_file)
        return read_token(self.state_dir), str(self.token_path)


def _script_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--controller")
    p.add_argument("--state-dir", type=Path)
    p.add_argument("--prometheus")
    p.add_argument("--token-file", type=Path)
    args, _ = p.parse_known_args(list(argv))
    return args


def _refresh(value: str | None) -> float:
    try:
        return max(0.5, float(value)) if value else DEFAULT_REFRESH_S
    except ValueError:
        return DEFAULT_REFRESH_S


def load_config(argv: Sequence[str], env: Mapping[str, str]) -> ConsoleConfig:
    args = _script_args(argv)
    url = args.controller or env.get("PDCTL_URL") or DEFAULT_URL
    state_dir = args.state_dir or Path(env.get("PDCTL_STATE_DIR") or DEFAULT_STATE_DIR)
    prom = args.prometheus or env.get("PDCTL_PROMETHEUS_URL") or None
    return ConsoleConfig(controller_url=url.rstrip("/"), state_dir=state_dir,
                         env_token=env.get("PDCTL_TOKEN") or None,
                         refresh_s=_refresh(env.get("PDCTL_CONSOLE_REFRESH_S")),
                         prometheus_url=prom.rstrip("/") if prom else None,
                         token_file=args.token_file or (Path(env["PDCTL_TOKEN_FILE"])
                                                        if env.get("PDCTL_TOKEN_FILE")
                                                        else None))


def current_config() -> ConsoleConfig:
    return load_config(sys.argv[1:], os.environ)
