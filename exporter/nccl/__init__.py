"""NCCL collective tracking: uprobe events and ingested records feed one tracker."""
