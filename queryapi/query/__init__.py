"""The query layer: registered queries (queries.yaml), safe PromQL rendering, MeshQL,
natural-language matching, LLM providers and the tool registry served over HTTP and MCP.
Only registered queries run, whoever asks. See docs/query.md."""
