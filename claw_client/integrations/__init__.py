"""Adapters from Claw-R1 batches to trainer libraries (each module imports its trainer's own
packages, if any, only when used): ``trl`` turns a ``steps`` pull into TRL's conversational
SFT rows and preference pairs."""
