"""Cluster topology graph and blast-radius simulation. No web dependency: the sidecar and
the CLI both call it (docs/chaos.md)."""
from .blast import FAILURE_TYPES, BlastRadiusEngine, BlastResult, ChaosInputError, impact_score
from .generator import FatTreeSpec, generate_fat_tree
from .inventory import InventoryError, load_topology
from .model import Job, Rank, Topology, TopologyError

__all__ = ["FAILURE_TYPES", "BlastRadiusEngine", "BlastResult", "ChaosInputError", "impact_score", "FatTreeSpec",
           "generate_fat_tree", "InventoryError", "load_topology", "Job", "Rank", "Topology", "TopologyError"]
