"""Compatibility layers for other agent-RL gateways' protocols (claw_r1: the Claw-R1 gateway)."""
