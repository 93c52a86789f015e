"""Cluster questions (seed 002): which ranks drag a communicator (median absolute
deviation of arrival lag across its ranks), what they cost, and what happened when."""
