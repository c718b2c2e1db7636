"""A controller's restart as an operator's tooling does it (systemd, a container's restart
policy), for ``pdctl fault restart-controller --restart-cmd``: ``python -m
tests.integration.restart_controller PIDFILE LOG`` stops the controller whose process id
PIDFILE holds (SIGTERM: it serves what it took and stops its engines), starts it again with
the same command line, directory and environment, its output appended to LOG, and writes the
new process id to PIDFILE."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def main(pidfile: Path, log: Path) -> int:
    pid = int(pidfile.read_text())
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    env = dict(line.split(b"=", 1) for line in
               Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in line)
    cwd = os.readlink(f"/proc/{pid}/cwd")
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while Path(f"/proc/{pid}").exists() and b"zombie" not in Path(
            f"/proc/{pid}/status").read_bytes().lower():
        if time.monotonic() > deadline:
            print(f"controller {pid} did not stop within 60 s", file=sys.stderr)
            return 1
        time.sleep(0.1)
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    pidfile.write_text(str(proc.pid))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
