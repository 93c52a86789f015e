"""NIC health semantics: thresholds, counter monitoring, roles, link state."""
