"""An OpenAI-compatible chat server for the learning loop's policy, answering as vLLM does.

``POST /v1/chat/completions`` (not streamed) renders the chat with the demo's toy tokenizer
(claw_site/demo/toy_tokenizer.py, the demo upstream's template) and decodes under the
constraint of ``examples.learning.policy``: the ``lookup`` call when the last message is the
user's, else one sampled digit and ``<|end|>``. With ``return_token_ids`` it returns vLLM's
top-level ``prompt_token_ids`` and ``choices[0].token_ids``; with ``logprobs`` one logprob per
response id in ``choices[0].logprobs.content`` (the demo upstream's contract,
claw_site/demo/upstream.py). ``GET /v1/models`` and ``GET /health`` answer too.

``load(state_dict, version)`` swaps in the trainer's newest weights between steps: every
answer is made by the weights of one version, and says which in ``x-policy-version``. The
server runs in a thread of the caller's process (uvicorn on a socket it was given) and
counts the seconds it spends in each completion (``busy_s``, ``calls``): the upstream's share
of a call, which the gateway's added latency is measured against.
"""

from __future__ import annotations

import copy
import socket
import threading
import time
from typing import Any

import numpy as np
import orjson
import torch
import uvicorn

from claw_site.demo.toy_tokenizer import END
from claw_site.demo.upstream import DemoReply, HttpError, _chat_prompt, _Ctx, _Options, _tool_to_call, _usage

from .policy import ANSWER_TOKENS, TOKENIZER, answer_logprobs, forced_reply

MODEL_ID = "claw-learning"


class PolicyServer:
    """The policy's chat server; ``with PolicyServer(model) as srv:`` serves at ``srv.url``."""

    def __init__(self, model: torch.nn.Module, *, version: int = 0, seed: int = 0):
        self._model = copy.deepcopy(model).eval()
        self.version = version
        self._lock = threading.Lock()
        self._rng = np.random.default_rng(seed)
        self._calls = 0
        self.busy_s = 0.0
        self.calls = 0
        self._sock = socket.socket()
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(256)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        config = uvicorn.Config(
            self.app, interface="asgi3", log_level="warning", lifespan="off", access_log=False
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    # --- the trainer's side ------------------------------------------------------------------
    def load(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Serve these weights as ``version`` from the next call on."""
        with self._lock:
            self._model.load_state_dict(state_dict)
            self.version = version

    def __enter__(self) -> PolicyServer:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the policy server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self.close()

    def close(self) -> None:
        self._sock.close()

    # --- the ASGI app --------------------------------------------------------------------------
    async def app(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        status, payload, headers = 200, None, []
        try:
            if (method, path) == ("GET", "/health"):
                payload = {}
            elif (method, path) == ("GET", "/v1/models"):
                payload = {"object": "list", "data": [{"id": MODEL_ID, "object": "model"}]}
            elif (method, path) == ("POST", "/v1/chat/completions"):
                body = orjson.loads(await _read(receive))
                t0 = time.perf_counter()
                payload, version = self.complete(body)
                self.busy_s += time.perf_counter() - t0
                self.calls += 1
                headers.append((b"x-policy-version", str(version).encode()))
            else:
                status, payload = 404, {"error": {"message": f"no route {path}", "type": "not_found"}}
        except HttpError as e:
            status, payload = e.status, {"error": {"message": e.message, "param": e.param}}
        body = orjson.dumps(payload)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json"), *headers],
            }
        )
        await send({"type": "http.response.body", "body": body})

    def complete(self, body: dict) -> tuple[dict, int]:
        """One chat completion (the decoding constraint of policy.py) and the version that made it."""
        prompt = _chat_prompt(body, add_generation_prompt=True)
        self._calls += 1
        ctx = _Ctx(token_ids=True, seed=0, request_id=f"{self._calls:08x}", drop=False)
        opts = _Options(body, ctx, chat=True)
        if opts.stream or opts.n != 1:
            raise HttpError(400, "the policy server answers one choice, not streamed", param="n")
        tool = _tool_to_call(body.get("tools"), body.get("tool_choice"), body["messages"])
        with self._lock:
            version = self.version
            if tool is not None:
                ids, call = forced_reply(tool, f"call_{self._calls:024x}")
                reply = DemoReply(ids, [0.0] * len(ids), None, [call], "tool_calls")
            else:
                with torch.no_grad():
                    lp = answer_logprobs(self._model, [prompt])[0].numpy()
                k = int(self._rng.choice(len(ANSWER_TOKENS), p=np.exp(lp) / np.exp(lp).sum()))
                ids = [ANSWER_TOKENS[k], END]
                reply = DemoReply(ids, [float(lp[k]), 0.0], TOKENIZER.decode(ids[:1]), None, "stop")
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if reply.tool_calls:
            message["tool_calls"] = reply.tool_calls
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "logprobs": {"content": opts.chat_logprobs(reply.ids, reply.logprobs)} if opts.logprobs else None,
            "finish_reason": reply.finish_reason,
        }
        resp: dict[str, Any] = {
            "id": f"chatcmpl-{ctx.request_id}",
            "object": "chat.completion",
            "created": ctx.created,
            "model": body.get("model") or MODEL_ID,
            "choices": [choice],
            "usage": _usage(prompt, [reply]),
        }
        if opts.return_ids:
            choice["token_ids"] = reply.ids
            resp["prompt_token_ids"] = prompt
        return resp, version


async def _read(receive: Any) -> bytes:
    chunks = []
    while True:
        msg = await receive()
        chunks.append(msg.get("body", b""))
        if not msg.get("more_body"):
            return b"".join(chunks)
