"""Reads of curation, one module per kind of read:

* ``specs``: what a dataset admits (a spec compiled to step predicates, its preview, its
  admitted steps and units) and the datasets with their versions;
* ``review``: the review queues, their scope, candidates and progress;
* ``pages``: the dashboard's list pages (overview, sources, trajectory and step browsers);
* ``timeline``: one trajectory and its steps (timeline, branches, step inspector, token ids);
* ``optimization``: prompt groups with their prefix-tree merges, and a merge laid out;
* ``live``: the dashboard's counters, one consistent read (the live websocket's state);
* ``consumption``: consumers' progress and health, leases and snapshots;
* ``lineage``: training runs, their checkpoints and what each trained on; ``diffs``: what
  changed between two dataset versions, two snapshots or two checkpoints;
* ``trace``: one trajectory laid out as a conversation; ``readiness_explain``: why a step is
  not ready; ``media``: the images a page shows.

Each is imported from its own module: this package re-exports nothing (an __init__ that
imports its modules would sit in a circle with each of them that imports a sibling).
"""
