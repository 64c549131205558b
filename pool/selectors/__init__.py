"""Reads of the pool: representations and aggregates, one module per kind of read.

* ``steps``: steps found and listed, their API representation (token ids rebuilt exactly),
  branch ends, a door's remembered texts, the step a Responses call answered with;
* ``trajectories``: trajectories and prompt groups, found, listed and rendered;
* ``service_events``: what black-box services tell (events, feedback), listed and rendered;
* ``policy``: policy versions, listed and rendered, and a policy's current version;
* ``media``, ``tasks``, ``task_sampler``: images; tasks and their statistics; the sampler;
* ``stats``: the whole pool's counts and token economics.

The REST views (gateway/apis/, curation/apis.py) read the pool through these, and filter
what they list with the FilterSets of gateway/filters.py: they never query the ORM
themselves. Each is imported from its own module (this package re-exports nothing).
"""
