"""The doors into the gateway: OpenAI chat completions and completions, the Anthropic
Messages API (``POST /v1/messages``) and the OpenAI Responses API (``POST /v1/responses``),
under every gateway base URL.

A door is a translator, not a second write path. Each call is translated into the chat
completion it means, sent to the upstream's ``/v1/chat/completions`` with
``return_token_ids`` (the only endpoint where vLLM and SGLang return exact ids) and
``logprobs`` (gateway/proxy/fields.py), recorded by
the chat-completions recording path (gateway/proxy/recording.py -> pool.ingest), and the
answer is translated back into the door's own shape (or, streamed, its own event sequence).
So a step recorded through a door holds the exact ids of the translated chat completion, the
chat messages they were rendered from, and ``metadata.protocol`` naming the door.

chat.py        chat completions and completions: the identity translation
base.py        what the translating doors share (Translator) and helpers for their answers
anthropic.py   Messages <-> chat completions, Anthropic SSE and errors, count_tokens
passthrough.py the Messages passthrough: a sending strategy of the runner
responses.py   Responses <-> chat completions, Responses SSE, previous_response_id

The envelope (auth, identity, errors), the upstream call, its retries, streaming, recording
and faults are the runner's (gateway/proxy/runner.py), one for every door.
"""
