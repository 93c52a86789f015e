"""fabricscope sidecar: span/SLO ingestion and correlation, outlier ranks and their cost,
the registered-query layer (NL, MeshQL, MCP). Reads metrics through the Prometheus HTTP API."""
