"""fabricscope node exporter: one process per GPU node, collectors read at scrape time."""

__version__ = "0.1.0"
