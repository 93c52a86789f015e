"""Cluster topology graph and blast-radius simulation. No web dependency: the sidecar and
the CLI both call it."""
