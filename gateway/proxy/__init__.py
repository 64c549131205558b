"""The OpenAI-compatible gateway for black-box agents.

Agents point their OpenAI base URL at ``/v1`` (or the scoped ``/t/<trajectory>/<group>/v1``).
Each call is forwarded to CLAW_UPSTREAM_URL with httpx, asking the inference server for the
exact token ids it used, and recorded as steps (pool.ingest.steps_append) before the agent gets
its answer. Modules: views (the endpoints), upstream (the shared client and fault mapping),
stream (SSE relay and accumulation), recording (answer -> steps), tokenizer (local fallback
for servers without ids), db (the thread pool that runs database work), access (API keys).
"""
