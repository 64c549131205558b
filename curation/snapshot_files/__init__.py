"""The files of a snapshot, one module per format, each a writer that takes the snapshot's
chunks of rendered steps (base.Chunk) as the build reads them and says at the end whether it
has a file to store. ``registry.FILES`` lists them: a new format is one module and one line
there (curation/services/snapshots.py writes every one it lists, the download API serves them
by name with their content type)."""
