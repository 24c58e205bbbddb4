"""Sample data: synthetic CT phantoms, honest sample bundles, sample training. Never imported by the server at
run time."""
