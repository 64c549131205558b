"""Write services of curation, one module per concern, each imported from its own module
(this package re-exports nothing):

* ``datasets``: datasets and their versions; ``labels``: operator labels, tags and notes
  (LabelIn);
* ``review``: review queues, claims and feedback; ``review_navigation``: a reviewer's way
  through a queue (skip, previous, restart);
* ``consume``: pulls under leases, acks, nacks and the serving order (PullIn, the pull
  contract); ``snapshots``: frozen datasets written as files (curation/snapshot_files/);
* ``lineage``: training runs and their checkpoints (RunIn); ``verdicts``: a trainer's verdicts
  on a lease's steps (VerdictsIn);
* ``retention``: retention policies run, archives written and restored;
* ``users``: users and roles; ``media_thumbs``: image thumbnails for the pages.
"""
