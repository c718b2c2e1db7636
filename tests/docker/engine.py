"""A Docker engine, a local Debian base image and the compose lab's images, for the tests in
this folder. Used as a user would use them: Debian's ``docker.io`` engine and CLI, Debian's
``docker-compose`` 1.29 (with BuildKit for the builds, as docker/compose.cpu.yml says), the
images built from the repository's Dockerfiles.

No registry is reachable here, so the base image is a Debian root made with ``debootstrap``
and imported (kept by the engine between runs on one machine), Prometheus's image is built
from Debian's package (docker/Dockerfile.prometheus), and pip inside the build gets this
host's CA bundle and CPU torch wheel through docker/build-inputs/ (``PIP_CERT``,
``PIP_FIND_LINKS``). The engine is started here when none is running, and stopped again at
the end: whatever starts it stops it."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKER_DIR = ROOT / "docker"
BUILD_INPUTS = DOCKER_DIR / "build-inputs"
BASE_IMAGE = "pdctl-base:bookworm"
PROMETHEUS_IMAGE = "pdctl-prometheus:local"
# Debian's CLI, the engine's own version (a newer CLI elsewhere on PATH wants buildx for
# BuildKit builds).
DOCKER = "/usr/bin/docker"
COMPOSE = "/usr/bin/docker-compose"
SOCKET = Path("/var/run/docker.sock")


class DockerMissing(RuntimeError):
    pass


def run(argv: Sequence[str], timeout: float = 120, env: dict[str, str] | None = None,
        check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env=env)
    if check and out.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {out.returncode}:\n"
                             f"{out.stdout[-4000:]}\n{out.stderr[-4000:]}")
    return out


def engine_answers() -> bool:
    return subprocess.run([DOCKER, "info"], capture_output=True, timeout=30).returncode == 0


@contextlib.contextmanager
def docker_engine(log_dir: Path) -> Iterator[None]:
    """A running engine: the one already running, or ``dockerd`` started here and stopped
    (SIGTERM, its containers with it) when the block ends."""
    for tool in (DOCKER, COMPOSE, "/usr/sbin/dockerd"):
        if not Path(tool).exists():
            raise DockerMissing(f"{tool} is missing: `make docker` installs Debian's docker.io, "
                                "docker-compose and debootstrap")
    if engine_answers():
        yield
        return
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / "dockerd.log", "wb") as log:
        proc = subprocess.Popen(["/usr/sbin/dockerd", "--host", f"unix://{SOCKET}"],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not engine_answers():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise DockerMissing("dockerd did not start:\n"
                                    + (log_dir / "dockerd.log").read_text()[-3000:])
            time.sleep(0.5)
        yield
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def image_exists(name: str) -> bool:
    return subprocess.run([DOCKER, "image", "inspect", name], capture_output=True,
                          timeout=30).returncode == 0


def image_size_mb(name: str) -> float:
    out = run([DOCKER, "image", "inspect", "--format", "{{.Size}}", name])
    return int(out.stdout.strip()) / 1e6


def image_id(name: str) -> str | None:
    out = run([DOCKER, "image", "inspect", "--format", "{{.Id}}", name], check=False)
    return out.stdout.strip() if out.returncode == 0 else None


# What the builds may keep in the engine's build cache between runs on one machine: enough for
# the next build to reuse the pip layers, bounded so that runs do not fill the disk.
BUILD_CACHE_KEEP = "8GB"


def drop_replaced(before: dict[str, str | None]) -> list[str]:
    """Remove the images that a rebuild replaced (the tag moved, the old image left untagged:
    about 5.6 GB per run of this lab) and trim the build cache to ``BUILD_CACHE_KEEP``; the
    ids removed."""
    removed = []
    for name, old in before.items():
        if old is not None and image_id(name) != old:
            if run([DOCKER, "image", "rm", old], check=False).returncode == 0:
                removed.append(old)
    run([DOCKER, "builder", "prune", "-f", "--keep-storage", BUILD_CACHE_KEEP],
        timeout=600, check=False)
    return removed


def debian_mirror() -> str:
    """The Debian mirror this host's apt uses (deb822 or one-line sources)."""
    for path in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        m = re.search(r"^URIs:\s*(\S+/debian)\s*$", path.read_text(), re.M)
        if m:
            return m.group(1)
    lists = [Path("/etc/apt/sources.list"), *Path("/etc/apt/sources.list.d").glob("*.list")]
    for path in lists:
        if path.exists():
            m = re.search(r"^deb\s+(?:\[[^]]*\]\s+)?(\S+/debian)\s+bookworm\b", path.read_text(),
                          re.M)
            if m:
                return m.group(1)
    return "http://deb.debian.org/debian"


def ensure_base_image() -> float:
    """``pdctl-base:bookworm``: a minimal Debian bookworm root; seconds spent making it (0 when
    the engine already had it)."""
    if image_exists(BASE_IMAGE):
        return 0.0
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="pdctl-debootstrap-") as root:
        run(["debootstrap", "--variant=minbase", "bookworm", root, debian_mirror()], timeout=1800)
        tar = subprocess.Popen(["tar", "-C", root, "-c", "."], stdout=subprocess.PIPE)
        try:
            subprocess.run([DOCKER, "import", "-", BASE_IMAGE], stdin=tar.stdout, check=True,
                           capture_output=True, timeout=600)
        finally:
            if tar.stdout:
                tar.stdout.close()
            tar.wait()
    return time.monotonic() - t0


def fill_build_inputs() -> bool:
    """This host's CA bundle and local wheels into docker/build-inputs/ (git ignores them);
    True when a CPU torch wheel is among them (then PyTorch's index is not needed)."""
    cert = os.environ.get("PIP_CERT")
    if cert and Path(cert).is_file():
        shutil.copyfile(cert, BUILD_INPUTS / "ca.crt")
    torch = False
    for folder in os.environ.get("PIP_FIND_LINKS", "").split():
        for wheel in Path(folder).glob("torch-*+cpu-*.whl") if Path(folder).is_dir() else []:
            dest = BUILD_INPUTS / "wheels" / wheel.name
            dest.parent.mkdir(exist_ok=True)
            if not dest.exists():
                try:
                    os.link(wheel, dest)
                except OSError:
                    shutil.copyfile(wheel, dest)
            torch = True
    return torch


@dataclass
class Compose:
    """``docker-compose -p <project> -f docker/<file>`` with the lab's knobs in its
    environment (as a user sets them in docker/.env or the shell)."""

    project: str
    file: str
    knobs: dict[str, str] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        path = f"/usr/bin:/usr/sbin:{os.environ.get('PATH', '')}"
        # COMPOSE_HTTP_TIMEOUT: 1.29's client gives up on a stop after 60 s by default, the
        # controller's stop_grace_period (its engines drain and stop).
        return {**os.environ, "PATH": path, "COMPOSE_DOCKER_CLI_BUILD": "1",
                "DOCKER_BUILDKIT": "1", "COMPOSE_HTTP_TIMEOUT": "300", **self.knobs}

    def __call__(self, *args: str, timeout: float = 600, check: bool = True
                 ) -> subprocess.CompletedProcess[str]:
        return run([COMPOSE, "-p", self.project, "-f", str(DOCKER_DIR / self.file), *args],
                   timeout=timeout, env=self.env, check=check)

    def containers(self, all_: bool = True) -> list[str]:
        argv = [DOCKER, "ps", "-q", "--filter", f"label=com.docker.compose.project={self.project}"]
        return run([*argv, "-a"] if all_ else argv).stdout.split()

    def volumes(self) -> list[str]:
        out = run([DOCKER, "volume", "ls", "-q", "--filter",
                   f"label=com.docker.compose.project={self.project}"])
        return out.stdout.split()

    def networks(self) -> list[str]:
        out = run([DOCKER, "network", "ls", "-q", "--filter",
                   f"label=com.docker.compose.project={self.project}"])
        return out.stdout.split()

    def remove_all(self) -> None:
        """What ``down -v`` should have removed, removed by hand (a teardown's last resort)."""
        for cid in self.containers():
            run([DOCKER, "rm", "-f", cid], check=False)
        for vol in self.volumes():
            run([DOCKER, "volume", "rm", "-f", vol], check=False)
        for net in self.networks():
            run([DOCKER, "network", "rm", net], check=False)

    def inspect(self, service: str) -> dict[str, object]:
        cid = self("ps", "-q", service).stdout.strip()
        assert cid, f"no container for {service}"
        doc: list[dict[str, object]] = json.loads(run([DOCKER, "inspect", cid]).stdout)
        return doc[0]
