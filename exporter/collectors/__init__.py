"""One module per subsystem; each registers its Collector with @framework.register."""
