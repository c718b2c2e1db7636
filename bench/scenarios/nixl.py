"""Raw NIXL host-to-host bandwidth on this machine, the baseline for the lab's KV transfers.

Two NIXL agents (UCX backend) in one process; the reader pulls a registered DRAM buffer of
the other agent, as a decode engine pulls a prefill engine's KV blocks. Each size is moved
``--repeat`` times and checked byte for byte; a plain memcpy of the same size is measured in
the same run as the machine's ceiling (medians of the repeats, ``bench.stats``). Optionally
compares with the NIXL bandwidth the real lab's decode engines reported to a running
controller (``--controller URL --token T``).

    .venv/bin/python -m bench nixl [--sizes 786432 16777216 268435456]
"""

from __future__ import annotations

import argparse
import time
import uuid
from dataclasses import dataclass, field

import httpx
import numpy as np

from bench import stats
from bench.scenario import Scenario


@dataclass
class NixlOptions:
    sizes: list[int] = field(default_factory=lambda: [786_432, 16 << 20, 256 << 20])
    repeat: int = 5
    controller: str | None = None  # a running lab controller to compare with
    token: str | None = None


@dataclass
class SizeTiming:
    nbytes: int
    nixl_s: float  # median of the repeats
    memcpy_s: float


@dataclass
class NixlResult:
    options: NixlOptions
    sizes: list[SizeTiming]
    lab_gbps: float | None = None  # the lab's decode engines' own figure


def nixl_read_seconds(nbytes: int, repeat: int) -> list[float]:
    from nixl._api import nixl_agent, nixl_agent_config

    cfg = nixl_agent_config(backends=["UCX"])
    reader = nixl_agent(f"reader-{uuid.uuid4().hex[:6]}", cfg)
    owner = nixl_agent(f"owner-{uuid.uuid4().hex[:6]}", cfg)
    src = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    dst = np.zeros(nbytes, dtype=np.uint8)
    descs = {name: np.array([[buf.ctypes.data, nbytes, 0]], dtype=np.uint64)
             for name, buf in (("src", src), ("dst", dst))}
    owner.register_memory(descs["src"], "DRAM")
    reader.register_memory(descs["dst"], "DRAM")
    remote = reader.add_remote_agent(owner.get_agent_metadata())
    local_x = reader.get_xfer_descs(descs["dst"], "DRAM")
    remote_x = reader.get_xfer_descs(descs["src"], "DRAM")
    times = []
    for _ in range(repeat):
        dst[:] = 0
        handle = reader.initialize_xfer("READ", local_x, remote_x, remote)
        t0 = time.perf_counter()
        state = reader.transfer(handle)
        while state not in ("DONE", "ERR"):
            state = reader.check_xfer_state(handle)
        times.append(time.perf_counter() - t0)
        reader.release_xfer_handle(handle)
        if state == "ERR" or not np.array_equal(src, dst):
            raise SystemExit(f"NIXL transfer of {nbytes} bytes failed or corrupted data")
    reader.remove_remote_agent(remote)
    return times


def memcpy_seconds(nbytes: int, repeat: int) -> list[float]:
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        out.append(time.perf_counter() - t0)
    return out


def lab_gbps(url: str, token: str) -> float:
    data = httpx.get(f"{url}/api/v1/stats", headers={"Authorization": f"Bearer {token}"},
                     timeout=10).json()
    return float(data["pools"]["decode"]["nixl"]["gbps"])


class NixlTool(Scenario[NixlOptions, NixlResult], name="nixl", alias="bench.nixl", in_suite=False):
    """Raw NIXL host-to-host bandwidth against memcpy

    Two NIXL agents (UCX) in one process, the reader pulling the other's DRAM buffer; a memcpy
    of the same size as the machine's ceiling."""

    def add_options(self, ap: argparse.ArgumentParser) -> None:
        ap.add_argument("--sizes", type=int, nargs="+", default=NixlOptions().sizes)
        ap.add_argument("--repeat", type=int, default=NixlOptions.repeat)
        ap.add_argument("--controller", help="a running lab controller to compare with")
        ap.add_argument("--token", help="its API token")

    def options(self, args: argparse.Namespace) -> NixlOptions:
        return NixlOptions(args.sizes, args.repeat, args.controller, args.token)

    def defaults(self, quick: bool) -> NixlOptions:
        return NixlOptions()

    def run(self, options: NixlOptions) -> NixlResult:
        res = NixlResult(options, [
            SizeTiming(n, stats.median(nixl_read_seconds(n, options.repeat)),
                       stats.median(memcpy_seconds(n, options.repeat)))
            for n in options.sizes])
        if options.controller and options.token:
            res.lab_gbps = lab_gbps(options.controller, options.token)
        return res

    def report(self, result: NixlResult) -> str:
        lines = [f"{'bytes':>12} | {'NIXL read median':>16} {'GB/s':>7} | {'memcpy GB/s':>11} | "
                 f"{'NIXL/memcpy':>11}"]
        for t in result.sizes:
            n, nixl, copy = t.nbytes, t.nixl_s, t.memcpy_s
            lines.append(f"{n:>12} | {nixl * 1e3:>14.3f}ms {n / nixl / 1e9:>7.2f} | "
                         f"{n / copy / 1e9:>11.2f} | {copy / nixl:>11.2f}")
        if result.lab_gbps is not None:
            lines.append(f"lab decode engines' NIXL bandwidth (vllm:nixl_bytes_transferred / "
                         f"vllm:nixl_xfer_time_seconds): {result.lab_gbps:.3f} GB/s")
        return "\n".join(lines)
