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

  // A Prometheus duration ('90s', '5m', '1h30m') in seconds, for thresholds scaled to a
  // window (a per-hour boundary applied to a 5-minute window).
  seconds(d)::
    local units = { s: 1, m: 60, h: 3600, d: 86400 };
    local step(acc, c) =
      if std.member('0123456789', c) then acc { digits+: c }
      else acc { total+: std.parseInt(acc.digits) * units[c], digits: '' };
    std.foldl(step, std.stringChars(d), { total: 0, digits: '' }).total,
}
