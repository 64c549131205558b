"""A closed RL loop through the middleware, on CPU: a policy server, tool-using agents on the
official ``openai`` SDK, and a GRPO trainer on ``claw_client`` (``python -m bench.learning``)."""
