-- Which door a span came in by (seed batch format or OTLP), so the two can be told apart
-- when an exporter misbehaves. Rows stored before this migration were seed-format.
ALTER TABLE spans ADD COLUMN ingest_format TEXT NOT NULL DEFAULT 'seed';
CREATE INDEX alerts_name ON alerts (alertname, last_received_ms);
