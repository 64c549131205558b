"""Shared infrastructure below every app: what any app may use and that uses no app.

* ``llm/``: the client of the LLM inference server (the upstream): the HTTP transport, the
  upstream client and its per-process connection pools, the SSE parser, the local tokenizer.
"""
