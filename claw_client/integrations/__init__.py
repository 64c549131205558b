"""Adapters from pulled batches to trainers' own types, one module per trainer.

Each module imports its trainer's packages when it is imported, and only then:

* ``claw_client.integrations.verl``: ``to_dataproto(batch)``, a verl ``DataProto`` (needs
  verl, tensordict, torch);
* ``claw_client.integrations.clawr1``: ``DataPool``, a drop-in for Claw-R1's DataPool Ray
  actor backed by the server (needs ray; verl for its default converter);
* ``claw_client.integrations.trl``: a ``steps`` pull as TRL's conversational SFT rows and
  preference pairs (no trainer package needed to convert).
"""
