"""The external backend serves the model its engines serve (``controller.launchers.
external_model``): learnt from their /v1/models, refused when they disagree or the
configuration names another, and served with the architecture unknown when no profile
gives it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from controller.config import load_settings
from controller.config.settings import Settings, UnknownArchitecture
from controller.errors import ConfigError
from controller.launchers.external_model import Answered, agreed, ask, ask_all, resolve

P, D1, D2 = "http://127.0.0.1:8100", "http://127.0.0.1:8200", "http://127.0.0.1:8201"


def external(tmp_path: Path, **model: str) -> Settings:
    return load_settings(None, backend="external", model=model,
                         controller={"state_dir": str(tmp_path)},
                         pools={"prefill": {"urls": [P]}, "decode": {"urls": [D1, D2]}})


def serving(models: dict[str, str | None]) -> Callable[[str], Answered | str]:
    def asker(url: str) -> Answered | str:
        name = models.get(url)
        return Answered(url, name, 4096) if name else "ConnectError: refused"
    return asker


def test_engines_model_is_served_with_its_context(tmp_path: Path) -> None:
    s = resolve(external(tmp_path), serving({P: "acme/chat-7b", D1: "acme/chat-7b",
                                             D2: "acme/chat-7b"}))
    assert s.model.public_name == "acme/chat-7b"
    assert s.served_context == 4096
    # No profile and no path: the numbers are unknown, never a default model's.
    assert s.known_profile is None
    with pytest.raises(UnknownArchitecture):
        _ = s.model_profile


def test_a_model_served_under_a_profiles_name_takes_it(tmp_path: Path) -> None:
    s = resolve(external(tmp_path), serving({P: "llama-3-8b", D1: "llama-3-8b"}))
    assert s.known_profile is not None and s.known_profile.name == "llama-3-8b"


def test_a_profile_named_gives_the_numbers(tmp_path: Path) -> None:
    s = resolve(external(tmp_path, name="llama-3-8b", served_name="meta/Llama-3-8B"),
                serving({P: "meta/Llama-3-8B", D1: "meta/Llama-3-8B", D2: None}))
    assert s.model.public_name == "meta/Llama-3-8B"
    assert s.known_profile is not None and s.known_profile.name == "llama-3-8b"


def test_engines_that_disagree_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="serve different models.*8200 serves 'b'"):
        resolve(external(tmp_path), serving({P: "a", D1: "b", D2: "a"}))


def test_a_named_model_the_engines_do_not_serve_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="engines serve 'acme/x', but model.name is "
                                          "'llama-3-70b'.*model.served_name: acme/x"):
        resolve(external(tmp_path, name="llama-3-70b"),
                serving({P: "acme/x", D1: "acme/x", D2: "acme/x"}))


def test_no_answer_and_no_name_is_refused_after_waiting(tmp_path: Path) -> None:
    now = [0.0]
    said: list[str] = []

    def sleep(s: float) -> None:
        now[0] += s

    answered, failed = ask_all([P, D1], serving({}), 10.0, said.append, lambda: now[0], sleep)
    assert answered == [] and set(failed) == {P, D1} and now[0] >= 10.0
    assert said and "waiting for the external engines" in said[0]
    with pytest.raises(ConfigError, match="no external engine answered.*model.served_name"):
        agreed(external(tmp_path), answered, failed)


def test_no_answer_with_a_name_serves_it(tmp_path: Path) -> None:
    s = resolve(external(tmp_path, served_name="acme/x", name="acme/x"), serving({}))
    assert s.model.public_name == "acme/x" and s.known_profile is None


def test_engines_pdctl_runs_still_need_a_profile() -> None:
    with pytest.raises(ConfigError, match="unknown model profile 'acme/x'"):
        load_settings(None, backend="sim", model={"name": "acme/x"})
    assert load_settings(None, backend="sim").model.name == "llama-3-70b"


def test_ask_reads_an_answer_and_names_a_failure() -> None:
    got = ask("http://127.0.0.1:9", timeout_s=0.5)  # the discard port: nothing listens
    assert isinstance(got, str) and got
