"""Pages of the pool for people: reviewers view trajectories and give feedback; operators
also label steps, build datasets and create review queues.

Each view validates its input, calls one service or selector and renders. Access is by
permission, never by name: anonymous users are sent to the sign-in page, a signed-in user
without the permission gets 403. Reviewing needs ``pool.add_feedback``; curating (labels,
datasets, queues) ``pool.change_step`` (curation/roles.py gives each role its set).

With a read replica configured (DATABASE_REPLICA_URL), the pages marked ``replica_view`` are
read from it on GET (and say so, with its lag); their forms that write, the review pages
(claims are writes), a prefix tree merged on demand and a lease's replay read the primary
(pool/replica.py).

One module per stage (curation/urls.py routes each path to its view): ``collection``
(overview, trajectories, steps), ``optimization``, ``curation`` (labels, datasets),
``review``, ``consumption`` (consumers, runs, checkpoints, diffs), ``media``, ``tasks``;
``access`` holds the permissions and the sign-in views they share.
"""
