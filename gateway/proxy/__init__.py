"""The OpenAI-compatible gateway for black-box agents.

Agents point their OpenAI base URL at ``/v1`` (or the scoped ``/t/<trajectory>/<group>/v1``).
Each call is forwarded to CLAW_UPSTREAM_URL with httpx, asking the inference server for the
exact token ids it used, and recorded as steps (pool.ingest.pipeline.steps_append) before the agent gets
its answer. Modules: views (the OpenAI endpoints), doors/ (each protocol's translation),
envelope (the request envelope every endpoint shares), runner (the one upstream call:
send, retry, relay or stream, record), faults (Events of failed calls, and recording),
fields (what is added to the agent's request and taken out of the answer), upstream (the
shared client and fault mapping), transport (its HTTP/1.1 transport), stream (SSE parsing
and accumulation), recording (answer -> steps), branches (a trajectory's branches),
tokenizer (local fallback for servers without ids), db (the thread pool that runs database
work), access (API keys and capability tokens).
"""
