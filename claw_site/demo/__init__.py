"""The built-in demo: a toy tokenizer, an upstream that answers like vLLM, and demo traffic.

`make run` starts the demo upstream and the demo agents when CLAW_DEMO is on and no
CLAW_UPSTREAM_URL is configured, so a fresh checkout shows live data without a GPU.
"""
