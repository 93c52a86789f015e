"""fabricscope sidecar: span/SLO ingestion and correlation, outlier ranks and their cost,
the registered-query layer (NL, MeshQL, MCP). Reads metrics through the Prometheus HTTP API.

Adding an area (a blueprint)
----------------------------
1. Write `queryapi/<area>.py` (or a package) with an apiflask blueprint:

       from apiflask import APIBlueprint
       from pydantic import BaseModel
       from fabricscope.queryapi.auth import require_scope, open_endpoint, current_key
       from fabricscope.queryapi.context import sidecar
       from fabricscope.queryapi.errors import ApiError

       bp = APIBlueprint("chaos", __name__, tag="Chaos")

       class SimulateIn(BaseModel):            # pydantic: validated, in the OpenAPI doc
           device: str

       @bp.post("/chaos/simulate")
       @require_scope("write")                 # read | write | admin; none given = read
       @bp.input(SimulateIn)                   # 422 with field paths on bad input
       @bp.doc(summary="Start a blast-radius simulation")
       def simulate(json_data: SimulateIn):
           state = sidecar()                   # config, storage, prom, metrics, workers
           state.storage.save_simulation(sim_id, "running", {...})
           samples = state.prom.query('up{job="fabricscope"}')   # PrometheusError -> 502/503/504
           if not samples:
               raise ApiError(404, "no such device", code="device_not_found")
           return {...}

   Probes and the query catalog use `@open_endpoint` instead of `require_scope`.
2. Add `"fabricscope.queryapi.<area>:bp"` to `BLUEPRINTS` in queryapi/app.py. If the
   module defines `setup(app, state)`, it is called once after registration: add a
   capability name to `state.capabilities` (listed by GET /api/versions) or a
   `workers.PeriodicWorker` to `state.workers` (started once the server listens).
3. Nothing else: auth → audit → rate limit run before every handler, errors come out as
   `{"error": {"code", "message", "detail"}}`, and the endpoint appears in
   GET /api/v1/openapi.json.

Reaching the rest of the sidecar
--------------------------------
- `sidecar().storage` (storage/base.py `Storage`): spans, correlations, alerts,
  `save_session/load_session` (query conversations), `save_simulation/load_simulation`
  (chaos results). New tables: add the next numbered file in storage/migrations/ (SQL
  shared by SQLite and PostgreSQL; `@AUTO_ID@` for an auto-increment key) and methods in
  storage/sql.py.
- `sidecar().prom` (prom.py `PrometheusClient`): `query(promql, at=None)`,
  `query_range`, `series`, `label_values`. Put user-supplied values into PromQL only
  through promql.py (`quote`, `escape_label_value`, `equals_any`).
- `sidecar().metrics`: the private registry served at /metrics; register new metrics on
  `sidecar().metrics.registry` in `setup()`.
- Tests: `create_app({"insecure_no_tls": True, "database": str(tmp_path / "db"),
  "keys_file": ...})` and `app.test_client()`; real-process tests use
  fabricscope.demo.stack.sidecar.start_sidecar (TLS with the demo CA).
"""
