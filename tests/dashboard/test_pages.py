"""The console as a whole under Streamlit's AppTest, against a fake controller: every
page renders; an unreachable controller, a refused or missing token and their mending; a
viewer's console; live refresh; an older controller on every page."""

from __future__ import annotations

import pytest

from dashboard.config import ConsoleConfig
from tests.dashboard.fake import TOKEN, URL, FakeController, make_instances
from tests.dashboard.page_helpers import (
    PAGES,
    Console,
    by_label,
    frame_with,
    no_exceptions,
    quarantine_decode,
    texts,
)


@pytest.mark.parametrize("page", PAGES)
def test_every_page_renders(console: Console, fake: FakeController, page: str) -> None:
    fake.instances = make_instances(40, 80)
    at = console(fake, page)
    no_exceptions(at)
    assert not at.error
    assert at.title[0].value == page.capitalize()


def test_unreachable_controller_says_so_and_renders_no_page(
        console: Console, fake: FakeController) -> None:
    fake.reachable = False
    at = console(fake)
    no_exceptions(at)
    assert len(at.error) == 1
    message = at.error[0].value
    assert f"Cannot reach the controller at {URL}" in message
    assert "Connection refused" in message and "PDCTL_URL" in message
    assert not at.title  # the page itself is not rendered


def test_console_recovers_when_the_controller_comes_back(
        console: Console, fake: FakeController) -> None:
    fake.reachable = False
    at = console(fake)
    fake.reachable = True
    at.run()
    no_exceptions(at)
    assert not at.error
    assert at.title[0].value == "Overview"


def test_wrong_token_is_explained(console: Console, fake: FakeController) -> None:
    at = console(fake, token="not-the-token")
    no_exceptions(at)
    message = texts(at.error)
    assert "refused the API token (401: missing or invalid bearer token" in message
    assert "token" in message and "state" in message  # names where the token was read
    assert not at.title


def test_a_token_entered_in_the_console_replaces_a_wrong_one(console: Console,
                                                             fake: FakeController) -> None:
    at = console(fake, token="not-the-token")
    assert not at.title
    by_label(at.text_input, "API token for this session").set_value("still-wrong")
    by_label(at.button, "Use this token").click()
    at.run()
    assert "entered in this console session" in texts(at.error) and not at.title
    by_label(at.text_input, "API token for this session").set_value(TOKEN)
    by_label(at.button, "Use this token").click()
    at.run()
    no_exceptions(at)
    assert not at.error and at.title[0].value == "Overview"
    assert "token entered in this session" in texts(at.sidebar.caption)
    by_label(at.sidebar.button, "Forget the entered token").click()
    at.run()
    assert "refused the API token" in texts(at.error) and not at.title


def test_a_token_no_header_can_carry_is_explained_not_a_crash(console: Console,
                                                              fake: FakeController) -> None:
    at = console(fake, token="tøken")  # e.g. a token file with a stray character
    no_exceptions(at)
    assert "holds characters an HTTP header cannot carry" in texts(at.error)
    assert fake.calls == [] and not at.title  # nothing sent
    by_label(at.text_input, "API token for this session").set_value("🙂")
    by_label(at.button, "Use this token").click()
    at.run()
    no_exceptions(at)
    assert "entered in this console session holds characters" in texts(at.error)


def test_an_actor_beyond_ascii_is_sent_as_its_ascii_part() -> None:
    """The operator's name goes into a header, which carries printable ASCII only."""
    import httpx

    from dashboard.client import ControllerClient

    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["X-Pdctl-Actor"])
        return httpx.Response(200, json=FakeController().routing)

    c = ControllerClient(URL, TOKEN, transport=httpx.MockTransport(handler),
                         actor="pdctl-console/Jørgen")
    c.routing()
    assert seen == ["pdctl-console/Jrgen"]


def test_missing_token_is_explained(console: Console, fake: FakeController) -> None:
    at = console(fake, token=None)
    assert "No API token" in texts(at.error)
    assert fake.calls == []  # nothing was sent without a token


def test_env_token_source_is_named(console: Console, fake: FakeController) -> None:
    at = console(fake, token="wrong", env_token="wrong")
    assert "PDCTL_TOKEN environment variable" in texts(at.error)


def test_a_viewer_console_shows_everything_and_offers_no_change(
        console: Console, fake: FakeController) -> None:
    fake.viewer = True
    at = console(fake, "controls")
    no_exceptions(at)
    assert "viewer token" in texts(at.info)
    assert not [b for b in at.button if "Review" in str(b.label)]
    assert "viewer token: read only" in texts(at.sidebar.caption)
    at = console(fake, "planner")
    assert "viewer token" in texts(at.info) and not at.get("form")


def test_live_refresh_can_be_paused(console: Console, fake: FakeController) -> None:
    at = console(fake)
    at.toggle(key="pdctl_live").set_value(False).run()
    no_exceptions(at)
    assert at.title[0].value == "Overview"


def test_config_refresh_default() -> None:
    assert ConsoleConfig().refresh_s == 2.0


@pytest.mark.parametrize("page", PAGES)
def test_older_controller_without_the_new_fields(console: Console, fake: FakeController,
                                                 page: str) -> None:
    fake.legacy = True
    quarantine_decode(fake)  # not sent by an older controller
    at = console(fake, page)
    no_exceptions(at)
    assert at.title[0].value == page.capitalize()
    if page == "planner":  # an older controller has no planner: the page says so
        assert "404" in texts(at.error) or "no route" in texts(at.error)
        return
    assert not at.error
    if page == "overview":
        at.session_state["overview-recent-table"] = True  # the expander opened
        at.run()
        assert (frame_with(at, "suspect")["suspect"] == "").all()
    if page == "transfer":
        assert frame_with(at, "notifications_after_expiry")["kv_expired_requests"].isna().all()
        assert "does not report the engines' KV lease counters" in texts(at.caption)
