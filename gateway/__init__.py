"""The gateway: every way data enters the pool (white-box REST, OpenAI proxy, Claw-R1 compat)."""
