"""The data plane's API key (``controller.api_key``, as vLLM's ``--api-key``): OpenAI's SDK
with the key is served; a wrong or missing key gets 401 in OpenAI's error shape, on every
``/v1/*`` path, and reaches no engine; the control API keeps its own token, and the health
paths stay open."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest

from tests.integration.harness import LONG_PROMPT, start_controller

KEY = "sk-test-pdctl-0123456789"


def test_the_api_key_guards_the_data_plane(tmp_path: Path) -> None:
    ctl = start_controller(tmp_path, {"controller": {"api_key": KEY}})
    try:
        good = openai.OpenAI(base_url=f"{ctl.url}/v1", api_key=KEY, max_retries=0)
        assert [m.id for m in good.models.list()] == ["llama-3-70b"]
        out = good.completions.create(model="llama-3-70b", prompt=LONG_PROMPT, max_tokens=2)
        assert out.choices[0].text
        n = len(ctl.get("/requests", limit=100))

        bad = openai.OpenAI(base_url=f"{ctl.url}/v1", api_key="sk-wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as err:
            bad.completions.create(model="llama-3-70b", prompt="hi", max_tokens=2)
        assert err.value.status_code == 401 and "API key" in err.value.message
        with pytest.raises(openai.AuthenticationError):
            bad.chat.completions.create(model="llama-3-70b", max_tokens=2,
                                        messages=[{"role": "user", "content": "hi"}])
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
        for headers in ({}, {"Authorization": f"Basic {KEY}"}, {"Authorization": KEY}):
            r = httpx.post(f"{ctl.url}/v1/completions", headers=headers, timeout=10,
                           json={"model": "llama-3-70b", "prompt": "hi", "max_tokens": 2})
            assert r.status_code == 401, headers
            assert r.json()["error"]["type"] == "invalid_request_error"
            assert r.headers["www-authenticate"] == "Bearer"
        assert len(ctl.get("/requests", limit=100)) == n  # refused before routing, unrecorded
        assert httpx.get(f"{ctl.url}/healthz", timeout=10).status_code == 200
        assert httpx.get(f"{ctl.url}/readyz", timeout=10).status_code == 200
        assert ctl.api("GET", "/cluster").status_code == 200  # the control API's own token
        assert ctl.api("GET", "/cluster", token=KEY).status_code == 401
    finally:
        ctl.stop()
