// Small helpers shared by the rule files.
{
  // "cluster, <labels...>": every aggregation keeps the cluster label, so one
  // Prometheus (or Thanos/Mimir above several) can watch many clusters.
  by(cfg, labels):: std.join(', ', [cfg.clusterLabel] + labels),

  // `metric{selector}` or bare `metric` when the selector is empty.
  selector(metric, sel):: if sel == '' then metric else '%s{%s}' % [metric, sel],

  // Numbers printed the way a human writes them: 3 not 3.0, 0.05 not
  // 0.050000000000000003 (std.toString prints 17 significant digits).
  num(x):: if x == std.floor(x) && std.abs(x) < 1e15 then '%d' % x else '%g' % x,
}
