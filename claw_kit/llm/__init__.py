"""The LLM inference server's client: ``transport`` (HTTP/1.1 keep-alive pools),
``upstream`` (the configured upstream and its client), ``sse`` (the event-stream parser and
the answer accumulator of streamed calls), ``tokenizer`` (CLAW_TOKENIZER, for upstreams that
give no token ids). Used by the gateway's doors and by the pool's reward judge."""
