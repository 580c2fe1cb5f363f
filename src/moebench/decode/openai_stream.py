"""A streaming client for OpenAI-compatible completion servers (vLLM, SGLang), stdlib only.

One request per trial: the prompt goes as a list of token ids (no tokenizer needed on either side),
greedy, exactly `max_tokens` output tokens (min_tokens + ignore_eos), `"stream": true`. Every
server-sent-event chunk is timed on arrival; with `"return_token_ids": true` (vLLM) a chunk says which
tokens it carries, otherwise one chunk is one token. The final usage chunk cross-checks the count.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Callable
from urllib.parse import urlsplit

from moebench.decode.stats import Trial


class StreamBroken(RuntimeError):
    """The server answered with an error, stalled, or closed the stream before it was complete."""


@dataclass
class _Url:
    scheme: str
    host: str
    port: int
    base_path: str

    @classmethod
    def parse(cls, url: str) -> "_Url":
        """Scheme, host, port and base path of a server URL."""
        u = urlsplit(url)
        port = u.port or (443 if u.scheme == "https" else 80)
        return cls(u.scheme, u.hostname or "127.0.0.1", port, u.path.rstrip("/"))

    def connect(self, timeout: float) -> http.client.HTTPConnection:
        """A connection whose every socket operation times out after `timeout` s."""
        cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        conn = cls(self.host, self.port, timeout=timeout)
        conn.connect()
        if _talks_to_itself(conn.sock):
            conn.close()
            raise ConnectionRefusedError(f"{self.host}:{self.port} is not listening (the connection was given "
                                         "that port as its own source port and reached itself)")
        return conn


def _talks_to_itself(sock: socket.socket | None) -> bool:
    """TCP self-connect: connecting to a local port that nothing listens on can succeed, with the
    connection's own source port equal to the port asked for, when that port is in the kernel's
    ephemeral range; every byte sent then comes back as the answer."""
    try:
        return sock is not None and sock.getsockname() == sock.getpeername()
    except OSError:
        return False


def get(url: str, path: str, timeout: float = 2.0) -> tuple[int, Any]:
    """GET base_url + path: (status, parsed JSON or text). Connection errors raise OSError."""
    u = _Url.parse(url)
    conn = u.connect(timeout)
    try:
        conn.request("GET", u.base_path + path)
        resp = conn.getresponse()
        body = resp.read().decode("utf-8", "replace")
        try:
            return resp.status, json.loads(body)
        except json.JSONDecodeError:
            return resp.status, body
    finally:
        conn.close()


def post_json(url: str, path: str, obj: dict, timeout: float) -> tuple[int, str]:
    """POST a JSON body to base_url + path: (status, the answer's text). Connection errors raise OSError."""
    u = _Url.parse(url)
    conn = u.connect(timeout)
    try:
        conn.request("POST", u.base_path + path, body=json.dumps(obj).encode(), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read().decode("utf-8", "replace")
    finally:
        conn.close()


def served_model(url: str, timeout: float = 5.0) -> str:
    """The first model id the server lists under /v1/models."""
    status, body = get(url, "/v1/models", timeout)
    if status != 200 or not isinstance(body, dict) or not body.get("data"):
        raise StreamBroken(f"GET /v1/models answered {status}: {str(body)[:200]}")
    return body["data"][0]["id"]


@dataclass
class StreamResult:
    """What one streamed completion produced (times in seconds since the request was sent)."""

    chunks: list[tuple[float, int]] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    usage_tokens: int | None = None
    last_was_bare_finish: bool = False  # the last chunk had no text and a finish_reason (no token ids sent)

    def reconcile(self) -> None:
        """Without token ids a chunk counts as one token; a closing chunk that only carries the
        finish_reason is not one, which the usage count tells (and then it is dropped)."""
        if (not self.token_ids and self.usage_tokens is not None and self.last_was_bare_finish
                and sum(n for _, n in self.chunks) == self.usage_tokens + 1):
            self.chunks.pop()

    def trial(self, warmup: bool) -> Trial:
        """The stream as a Trial."""
        return Trial(warmup, self.chunks, self.token_ids)


def completion_payload(model: str, prompt_ids: list[int], max_tokens: int) -> dict:
    """The request body: greedy, exactly max_tokens tokens, streamed with token ids and usage."""
    return {"model": model, "prompt": prompt_ids, "max_tokens": max_tokens, "min_tokens": max_tokens,
            "ignore_eos": True, "temperature": 0.0, "stream": True, "return_token_ids": True,
            "stream_options": {"include_usage": True}}


def stream_completion(url: str, payload: dict, *, read_timeout: float, deadline: float) -> StreamResult:
    """POST /v1/completions and time every chunk until `data: [DONE]`. read_timeout: longest silence
    allowed between chunks; deadline: time.monotonic() by which the whole stream must be complete."""
    res = StreamResult()
    post_stream(url, "/v1/completions", payload, lambda obj, now: _take_chunk(res, obj, now), lambda: _count(res),
                read_timeout=read_timeout, deadline=deadline)
    res.reconcile()
    return res


def post_stream(url: str, path: str, payload: dict, take: Callable[[dict, float], None], count: Callable[[], int], *,
                read_timeout: float, deadline: float) -> None:
    """POST a JSON body to a server-sent-events endpoint and hand every `data:` object to take(obj, seconds
    since the request was sent) until `data: [DONE]`. count() says how many tokens arrived (for messages).
    Raises StreamBroken when the server answers an error, stalls, or closes the stream early."""
    u = _Url.parse(url)
    conn = u.connect(read_timeout)
    try:
        body = json.dumps(payload).encode()
        t0 = time.perf_counter()
        conn.request("POST", u.base_path + path, body=body,
                     headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise StreamBroken(f"POST {path} answered HTTP {resp.status}: "
                               f"{resp.read(400).decode('utf-8', 'replace').strip()}")
        while True:
            if time.monotonic() > deadline:
                raise StreamBroken(f"trial deadline passed after {count()} tokens")
            line = resp.readline()
            now = time.perf_counter() - t0
            if not line:
                raise StreamBroken(f"the server closed the stream after {count()} tokens, before [DONE]")
            line = line.strip()
            if not line.startswith(b"data:"):
                continue  # blank separators, comments, event names
            data = line[5:].strip()
            if data == b"[DONE]":
                return
            take(json.loads(data), now)
    except (socket.timeout, TimeoutError):
        raise StreamBroken(f"no data for {read_timeout:.0f} s after {count()} tokens") from None
    except (ConnectionError, http.client.HTTPException, OSError) as e:
        raise StreamBroken(f"connection failed after {count()} tokens: {type(e).__name__}: {e}") from None
    finally:
        conn.close()


def _count(res: StreamResult) -> int:
    return sum(n for _, n in res.chunks)


def _take_chunk(res: StreamResult, obj: dict, now: float) -> None:
    if "error" in obj:
        raise StreamBroken(f"the server sent an error mid-stream: {str(obj['error'])[:300]}")
    if obj.get("usage"):
        res.usage_tokens = obj["usage"].get("completion_tokens")
    for choice in obj.get("choices") or []:
        ids = choice.get("token_ids")
        if ids is not None:
            if ids:
                res.chunks.append((now, len(ids)))
                res.token_ids.extend(int(i) for i in ids)
        else:  # a server that does not send token ids (SGLang; vLLM before return_token_ids)
            res.chunks.append((now, 1))
            res.last_was_bare_finish = not choice.get("text") and choice.get("finish_reason") is not None
