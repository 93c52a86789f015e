"""Grafana dashboards as code (grafanalib), rendered to committed JSON."""
