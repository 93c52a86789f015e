"""The demo cluster: simulated sources fed into the real collectors."""
