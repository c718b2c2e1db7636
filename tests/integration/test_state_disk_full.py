"""Fault scenario: the state directory's disk fills up under a running controller (a real
tmpfs, filled to the last byte). Clients are served as before; an operator's change that
cannot be recorded is refused with 503 and changes nothing; the condition shows in the
metrics; once there is room, changes are taken and recorded again."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.harness import LONG_PROMPT, pdctl_fault, start_controller

pytestmark = pytest.mark.slow


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """``tmp_path/state`` on a 16 MiB tmpfs of its own, unmounted afterwards."""
    state = tmp_path / "state"
    state.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(state)],
                   check=True)
    try:
        yield state
    finally:
        subprocess.run(["umount", "-l", str(state)], check=False)


def fill(directory: Path) -> Path:
    """A file taking every free byte of ``directory``'s file system."""
    filler = directory / "filler"
    with filler.open("wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    with contextlib.suppress(OSError), filler.open("ab") as f:  # the last partial block
        while True:
            f.write(b"\0")
            f.flush()
    return filler


def metric(url: str, name: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no {name}")


def test_a_full_state_disk_refuses_changes_and_serves_clients(tmp_path: Path,
                                                              small_disk: Path) -> None:
    ctl = start_controller(tmp_path, {"model": {"name": "llama-3-8b"},
                                      "pools": {"prefill": {"size": 1, "tp": 1},
                                                "decode": {"size": 1, "tp": 1}}})
    try:
        body = {"model": "llama-3-8b", "prompt": LONG_PROMPT, "max_tokens": 4}
        assert httpx.post(f"{ctl.url}/v1/completions", json=body, timeout=30).status_code == 200
        routing = ctl.get("/routing")
        pools = ctl.get("/pools/decode")["desired"]
        events = len(ctl.get("/events", limit=1000))
        filler = fill(small_disk)

        r = ctl.api("PATCH", "/routing", {"disagg_min_prompt_tokens": 999})
        assert r.status_code == 503 and "cannot be written" in r.json()["detail"], r.text
        assert ctl.get("/routing") == routing
        r = ctl.api("PATCH", "/pools/decode", {"size": 2})
        assert r.status_code == 503 and "nothing was changed" in r.json()["detail"], r.text
        assert ctl.get("/pools/decode")["desired"] == pools
        decode = ctl.get("/instances", role="decode")[0]
        assert ctl.api("POST", f"/instances/{decode['id']}/drain").status_code == 503
        assert ctl.get(f"/instances/{decode['id']}")["state"] == "ready"
        assert metric(ctl.url, "pdctl_state_writable") == 0
        assert "disk is full" in ctl.get("/cluster")["state_problem"]  # the console's banner
        # The data plane does not write the state directory: clients are served as before.
        for stream in (False, True):
            r = httpx.post(f"{ctl.url}/v1/completions", json={**body, "stream": stream},
                           timeout=30)
            assert r.status_code == 200 and "error" not in r.text
        assert httpx.get(f"{ctl.url}/readyz", timeout=5).status_code == 200

        os.unlink(filler)
        assert ctl.get("/cluster")["state_problem"] is None  # tried again with room
        r = ctl.api("PATCH", "/routing", {"disagg_min_prompt_tokens": 999})
        assert r.status_code == 200, r.text
        assert metric(ctl.url, "pdctl_state_writable") == 1
        kinds = [e["kind"] for e in ctl.get("/events", limit=1000)]
        assert len(kinds) == events + 1 and kinds[0] == "routing.update"
    finally:
        ctl.stop()


def test_pdctl_fault_fill_disk_is_rehearsed_on_a_small_state_disk(tmp_path: Path,
                                                                   small_disk: Path) -> None:
    """``pdctl fault fill-disk`` fills the controller's state disk under load: clients are
    served, a change meanwhile is refused with 503 and told in /cluster, and taken after."""
    ctl = start_controller(tmp_path, {"model": {"name": "llama-3-8b"}})
    try:
        rc, _, err = pdctl_fault(ctl.url, small_disk, "fill-disk", "--max-fill-mb", "8")
        assert rc == 2 and "over the 8 MiB" in err, err  # 16 MiB: not a disk it may fill
        rc, report, err = pdctl_fault(ctl.url, small_disk, "fill-disk", "--requests", "12",
                                      "--hold-s", "3")
        assert rc == 0, (report, err)
        assert [c["ok"] for c in report["checks"]] == [True] * 5, report
        told = report["checks"][-1]
        assert told["name"].startswith("the full disk is told"), told
        assert "while full: 503" in told["detail"] and "after: taken" in told["detail"]
        assert not (small_disk / ".pdctl-fault-ballast").exists()
        assert ctl.get("/cluster")["state_problem"] is None
    finally:
        ctl.stop()
