"""``controller.router.assemble``: a whole OpenAI answer from a stream's events, as a
non-streaming client gets it from a push-mode decode hop (which always streams). The merge
rules were checked against vLLM 0.32's own whole and streamed answers (completions with
logprobs, n=2 and echo; chat with logprobs and token ids)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from controller.router.assemble import AssembleError, Assembler, assemble


def sse(*events: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def cmpl(index: int, text: str, **more: Any) -> dict[str, Any]:
    return {"id": "cmpl-1", "object": "text_completion", "created": 5, "model": "m",
            "choices": [{"index": index, "text": text, "logprobs": None,
                         "finish_reason": None, "stop_reason": None, **more}]}


USAGE = {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}


def test_completion_choices_are_joined_by_index_with_usage_and_metrics() -> None:
    body = sse(cmpl(0, "Hel", token_ids=[1], prompt_token_ids=[7, 8, 9]),
               cmpl(1, "A", token_ids=[4]),
               cmpl(0, "lo", token_ids=[2, 3]),
               cmpl(1, "B", token_ids=[5], finish_reason="stop", stop_reason=None),
               cmpl(0, "", finish_reason="length"),
               {"id": "cmpl-1", "object": "text_completion", "created": 5, "model": "m",
                "choices": [], "usage": USAGE, "metrics": {"ttft_ms": 4.0}})
    out = assemble(body)
    assert out["object"] == "text_completion" and out["id"] == "cmpl-1"
    assert out["usage"] == USAGE and out["metrics"] == {"ttft_ms": 4.0}
    first, second = out["choices"]
    assert (first["index"], first["text"], first["token_ids"], first["finish_reason"]) == (
        0, "Hello", [1, 2, 3], "length")
    assert first["prompt_token_ids"] == [7, 8, 9]
    assert (second["index"], second["text"], second["token_ids"], second["finish_reason"]) \
        == (1, "AB", [4, 5], "stop")


def test_completion_logprobs_lists_are_appended() -> None:
    lp = [{"text_offset": [0], "token_logprobs": [-0.5], "tokens": ["a"],
           "top_logprobs": [{"a": -0.5}]},
          {"text_offset": [1], "token_logprobs": [-0.25], "tokens": ["b"],
           "top_logprobs": [{"b": -0.25}]}]
    out = assemble(sse(cmpl(0, "a", logprobs=lp[0]), cmpl(0, "b", logprobs=lp[1])))
    assert out["choices"][0]["logprobs"] == {
        "text_offset": [0, 1], "token_logprobs": [-0.5, -0.25], "tokens": ["a", "b"],
        "top_logprobs": [{"a": -0.5}, {"b": -0.25}]}


def chat(delta: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 5, "model": "m",
            "choices": [{"index": 0, "delta": delta, "logprobs": None,
                         "finish_reason": None, **more}]}


def test_chat_deltas_become_one_message_with_tool_calls_by_index() -> None:
    body = sse(chat({"role": "assistant", "content": ""}),
               chat({"reasoning_content": "think"}),
               chat({"content": "Hi"}),
               chat({"content": " there"}),
               chat({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                     "function": {"name": "get", "arguments": "{\"a\""}}]}),
               chat({"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}),
               chat({"tool_calls": [{"index": 1, "id": "call_2", "type": "function",
                                     "function": {"name": "put", "arguments": "{}"}}]}),
               chat({}, finish_reason="tool_calls"))
    out = assemble(body)
    assert out["object"] == "chat.completion"
    [choice] = out["choices"]
    assert choice["finish_reason"] == "tool_calls" and "delta" not in choice
    msg = choice["message"]
    assert (msg["role"], msg["content"], msg["reasoning_content"]) == (
        "assistant", "Hi there", "think")
    assert msg["tool_calls"] == [
        {"index": 0, "id": "call_1", "type": "function",
         "function": {"name": "get", "arguments": "{\"a\": 1}"}},
        {"index": 1, "id": "call_2", "type": "function",
         "function": {"name": "put", "arguments": "{}"}}]


def test_chat_logprobs_content_is_appended_not_joined_as_text() -> None:
    a = {"token": "x", "logprob": -1.0, "bytes": [120], "top_logprobs": []}
    b = {"token": "y", "logprob": -2.0, "bytes": [121], "top_logprobs": []}
    out = assemble(sse(chat({"role": "assistant", "content": "x"}, logprobs={"content": [a]}),
                       chat({"content": "y"}, logprobs={"content": [b]})))
    assert out["choices"][0]["logprobs"] == {"content": [a, b]}
    assert out["choices"][0]["message"]["content"] == "xy"


def test_a_role_only_in_the_first_delta_and_no_text_keeps_the_role() -> None:
    out = assemble(sse(chat({"role": "assistant"}), chat({}, finish_reason="length")))
    assert out["choices"][0]["message"] == {"role": "assistant"}


@pytest.mark.parametrize("body, match", [
    (b"data: [DONE]\n\n", "no events"),
    (b"data: {not json}\n\n", "not JSON"),
    (b"data: [1, 2]\n\n", "not a JSON object"),
    (sse({"error": {"message": "boom"}}), "carried an error"),
    (sse({"id": "x", "object": "text_completion"}), "without a choices list"),
    (sse({"choices": [{"index": "0", "text": "a"}]}), "integer index"),
])
def test_what_is_not_an_openai_stream_is_refused(body: bytes, match: str) -> None:
    with pytest.raises(AssembleError, match=match):
        assemble(body)


def test_events_fed_one_at_a_time_equal_the_whole_body() -> None:
    events = [cmpl(0, "a", token_ids=[1]), cmpl(0, "b", token_ids=[2], finish_reason="stop")]
    asm = Assembler()
    for e in events:
        asm.feed(e)
    assert asm.answer() == assemble(sse(*events))
