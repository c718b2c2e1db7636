"""Engines that run elsewhere, given by URL. The controller routes to them and watches their
health but cannot start, stop or resize them."""

from __future__ import annotations

from controller.errors import LaunchError
from controller.launchers.base import Launched, Launcher, LaunchSpec
from controller.models import Role


class ExternalLauncher(Launcher):
    name = "external"
    managed = False

    def __init__(self, urls: dict[Role, list[str]]) -> None:
        self._free = {role: list(u) for role, u in urls.items()}

    async def start(self, spec: LaunchSpec) -> Launched:
        free = self._free.get(spec.role, [])
        if not free:
            raise LaunchError(f"no unattached {spec.role.value} URL left")
        return Launched(url=free.pop(0).rstrip("/"), handle=spec.role)

    async def stop(self, launched: Launched, grace_s: float = 5.0) -> None:
        # Detach only: the engine is not ours to stop. Its URL can be attached again.
        self._free.setdefault(launched.handle, []).append(launched.url)
