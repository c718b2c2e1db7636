"""A fault rehearsal's load: distinct prompts long enough to go disaggregated, sent by a few
clients through the data plane like any client's, each answer read as a client reads it and
kept as a ``ClientOutcome``."""

from __future__ import annotations

import itertools
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import orjson

from controller.faults.outcome import HUNG, REFUSED, ClientOutcome

PROMPT_WORDS = ("prefill decode cache token batch stream queue block transfer router pool "
                "kernel memory layer attention request alpha beta gamma delta sigma omega"
                ).split()
MAX_ROUNDS = 100  # the load sends each prompt at most this often, however long the fault
REFUSED_PAUSE_S = 0.2  # after a refused connection: no controller listening


def fault_prompts(n: int, min_tokens: int, tag: str) -> list[str]:
    """``n`` prompts of at least ``min_tokens`` words (each word at least a token), each
    opening with its own number so that no two share a cached prefix, and each a draw of its
    own of numbered words: a small model with random weights gives different prompts different
    answers only where they differ throughout."""
    out = []
    for k in range(n):
        rng = random.Random(f"{tag}-{k}")
        words = (f"{rng.choice(PROMPT_WORDS)}{rng.randint(0, 99)}"
                 for _ in range(min_tokens + 4 * (k % 5)))
        out.append(f"{tag} request {k}: " + " ".join(words))
    return out


class DataClient:
    """The load's client: one completion, judged as a ``ClientOutcome``."""

    def __init__(self, url: str, model: str, max_tokens: int, timeout_s: float,
                 api_key: str | None, ignore_eos: bool = False) -> None:
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(base_url=url, headers=headers,
                                 timeout=httpx.Timeout(timeout_s, connect=5.0))
        self.model, self.max_tokens = model, max_tokens
        self.extra = {"ignore_eos": True} if ignore_eos else {}

    def close(self) -> None:
        self.http.close()

    def ask(self, rid: str, k: int, prompt: str, stream: bool) -> ClientOutcome:
        body = {"model": self.model, "prompt": prompt, "max_tokens": self.max_tokens,
                "temperature": 0, "stream": stream, **self.extra}
        t0, sent_at = time.monotonic(), time.time()

        def done(text: str | None = None, error: str | None = None,
                 answered: bool = True) -> ClientOutcome:
            return ClientOutcome(rid, k, time.monotonic() - t0, text, error, answered, sent_at)
        try:
            with self.http.stream("POST", "/v1/completions", json=body,
                                  headers={"x-request-id": rid}) as r:
                raw = r.read() if not stream or r.status_code != 200 else None
                if r.status_code != 200:
                    return done(error=http_error(r.status_code, raw or b""))
                if raw is not None:
                    return completion_outcome(raw, done)
                return stream_outcome(r.iter_lines(), done)
        except httpx.ConnectError as exc:
            return done(error=f"{REFUSED}: {exc}", answered=False)
        except httpx.TimeoutException:
            return done(error=HUNG, answered=False)
        except httpx.HTTPError as exc:
            return done(error=f"connection: {type(exc).__name__}: {exc}", answered=False)


def http_error(status: int, raw: bytes) -> str:
    """``http N: message`` for an error in OpenAI's shape; anything else is not clear."""
    try:
        message = orjson.loads(raw)["error"]["message"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return f"unclear answer {status}: {raw[:120]!r}"
    return f"http {status}: {str(message)[:160]}"


def completion_outcome(raw: bytes, done: Callable[..., ClientOutcome]) -> ClientOutcome:
    try:
        text = orjson.loads(raw)["choices"][0]["text"]
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        return done(error=f"unclear 200: {raw[:120]!r}")
    return done(text=text)


def stream_outcome(lines: Iterator[str], done: Callable[..., ClientOutcome]) -> ClientOutcome:
    parts: list[str] = []
    for line in lines:
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            return done(text="".join(parts))
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return done(error=f"unclear stream event: {payload[:120]!r}")
        if "error" in event:
            return done(error=f"stream error event: {str(event['error'])[:160]}")
        parts.extend(c.get("text") or "" for c in event.get("choices") or ())
    return done(error="stream ended without [DONE]")


def under_load(data: DataClient, asked: list[str], concurrency: int,
                fault: Callable[[], str]) -> tuple[list[ClientOutcome], float, str]:
    """``concurrency`` clients send the prompts in turn (every other request streamed), each
    request with an id of its own; the fault is injected once a few answers are in. The load
    goes on through the whole fault and until every prompt was sent at least once."""
    tag = os.urandom(4).hex()
    sent = itertools.count()
    over = threading.Event()
    outcomes: list[ClientOutcome] = []
    cap = len(asked) * MAX_ROUNDS

    def client() -> None:
        while (n := next(sent)) < cap and not (n >= len(asked) and over.is_set()):
            k = n % len(asked)
            o = data.ask(f"fault-{tag}-{n}", k, asked[k], n % 2 == 1)
            outcomes.append(o)
            if o.error and o.error.startswith(REFUSED):
                time.sleep(REFUSED_PAUSE_S)  # no controller listening: not a busy loop

    with ThreadPoolExecutor(concurrency) as pool:
        running = [pool.submit(client) for _ in range(concurrency)]
        first = min(len(asked), max(2, concurrency))
        while len(outcomes) < first and not all(f.done() for f in running):
            time.sleep(0.05)
        started = time.time()
        try:
            detail = fault()
        finally:
            over.set()
        for f in running:
            f.result()
    return outcomes, started, detail
