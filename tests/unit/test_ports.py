"""``controller.launchers.process.free_ports``: the ports an engine is told to listen on are
chosen below the kernel's ephemeral range, where no port-0 bind inside the engine (vLLM's,
torch's, ZMQ's) can take one first; not handed out twice in a row; the OS's choice where the
range leaves no room."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from controller.launchers import process


@pytest.fixture
def ephemeral(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "ip_local_port_range"
    monkeypatch.setattr(process, "EPHEMERAL_RANGE", path)
    monkeypatch.setattr(process, "_recent", type(process._recent)(maxlen=process.RECENT_PORTS))
    return path


def bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_ports_come_from_below_the_ephemeral_range_and_are_not_reused(ephemeral: Path) -> None:
    ephemeral.write_text("32768\t60999\n")
    seen: set[int] = set()
    for _ in range(20):
        ports = process.free_ports("127.0.0.1", 4)
        assert len(set(ports)) == 4
        assert all(process.PORT_FLOOR <= p < 32768 and bindable(p) for p in ports)
        assert not seen & set(ports)  # handed out lately: not again
        seen |= set(ports)


def test_without_room_below_the_range_the_os_chooses(ephemeral: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[int] = []
    monkeypatch.setattr(process, "_os_ports", lambda host, n: asked.append(n) or [1] * n)
    ephemeral.write_text("10500 60999\n")  # no room below
    assert process.free_ports("127.0.0.1", 3) == [1, 1, 1]
    ephemeral.unlink()  # not Linux
    assert process.free_ports("127.0.0.1", 2) == [1, 1]
    assert asked == [3, 2]
