"""Token-path tracing (seed 000 §14.4): span ingest in the seed's batch format and OTLP/HTTP,
SLO verdicts per (service, operation), and correlation of each violation with the
network anomalies Prometheus knows about on the span's network_path."""
