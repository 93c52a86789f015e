-- Spans, their SLO verdict and correlation state; correlations; received alerts;
-- query sessions; chaos simulation results. Times are Unix milliseconds.
-- @AUTO_ID@ is the dialect's auto-increment primary key (see storage/sql.py).
CREATE TABLE spans (
    pk @AUTO_ID@,
    trace_id TEXT NOT NULL,
    span_id TEXT NOT NULL,
    service TEXT NOT NULL,
    operation TEXT NOT NULL,
    start_ms BIGINT NOT NULL,
    end_ms BIGINT NOT NULL,
    duration_ms DOUBLE PRECISION NOT NULL,
    network_path TEXT NOT NULL,
    attributes TEXT NOT NULL,
    received_ms BIGINT NOT NULL,
    slo_ms DOUBLE PRECISION NOT NULL,
    violated INTEGER NOT NULL,
    -- none (within SLO) | pending (violation awaiting correlation) | done
    correlation_state TEXT NOT NULL,
    claim_until_ms BIGINT,
    UNIQUE (trace_id, span_id)
);
CREATE INDEX spans_violations ON spans (violated, end_ms);
CREATE INDEX spans_pending ON spans (correlation_state, pk);
CREATE INDEX spans_received ON spans (received_ms);
CREATE TABLE correlations (
    pk @AUTO_ID@,
    span_pk BIGINT NOT NULL UNIQUE,
    trace_id TEXT NOT NULL,
    span_id TEXT NOT NULL,
    service TEXT NOT NULL,
    operation TEXT NOT NULL,
    span_end_ms BIGINT NOT NULL,
    duration_ms DOUBLE PRECISION NOT NULL,
    slo_ms DOUBLE PRECISION NOT NULL,
    matched_anomaly_count INTEGER NOT NULL,
    path_length INTEGER NOT NULL,
    confidence DOUBLE PRECISION NOT NULL,
    anomalies TEXT NOT NULL,
    correlated_ms BIGINT NOT NULL
);
CREATE INDEX correlations_trace ON correlations (trace_id);
CREATE INDEX correlations_time ON correlations (correlated_ms);
-- One row per alert episode: Alertmanager re-sends an alert every group/repeat interval
-- with the same fingerprint and startsAt; those repeats update the row.
CREATE TABLE alerts (
    fingerprint TEXT NOT NULL,
    starts_at TEXT NOT NULL,
    alertname TEXT NOT NULL,
    status TEXT NOT NULL,
    labels TEXT NOT NULL,
    annotations TEXT NOT NULL,
    ends_at TEXT,
    generator_url TEXT,
    first_received_ms BIGINT NOT NULL,
    last_received_ms BIGINT NOT NULL,
    receive_count INTEGER NOT NULL,
    PRIMARY KEY (fingerprint, starts_at)
);
CREATE INDEX alerts_received ON alerts (last_received_ms);
CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    created_ms BIGINT NOT NULL,
    updated_ms BIGINT NOT NULL,
    data TEXT NOT NULL
);
CREATE TABLE simulation_results (
    id TEXT PRIMARY KEY,
    created_ms BIGINT NOT NULL,
    updated_ms BIGINT NOT NULL,
    status TEXT NOT NULL,
    data TEXT NOT NULL
);
