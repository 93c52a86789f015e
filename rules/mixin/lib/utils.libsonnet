// The helpers every alert and rule file shares: the one alert() and the config's sections
// under short names. An area file starts with
//   local utils = import '../lib/utils.libsonnet';
//   { local c = utils.context($._config), ... }
// and reads c.th (thresholds), c.w (windows), c.forOf (for: durations), c.sev
// (severities), c.by([...]) and the grouping labels below. `$._config` is read late, so
// withOverrides() (mixin.libsonnet) reaches every rule.

// Numbers printed the way a human writes them: 3 not 3.0, 0.05 not
// 0.050000000000000003 (std.toString prints 17 significant digits).
local num(x) = if x == std.floor(x) && std.abs(x) < 1e15 then '%d' % x else '%g' % x;

// "cluster, <labels...>": every aggregation keeps the cluster label, so one
// Prometheus (or Thanos/Mimir above several) can watch many clusters.
local by(cfg, labels) = std.join(', ', [cfg.clusterLabel] + labels);

{
  num:: num,
  by:: by,

  // `metric{selector}` or bare `metric` when the selector is empty.
  selector(metric, sel):: if sel == '' then metric else '%s{%s}' % [metric, sel],

  // A Prometheus duration ('90s', '5m', '1h30m') in seconds, for thresholds scaled to a
  // window (a per-hour boundary applied to a 5-minute window).
  seconds(d)::
    local units = { s: 1, m: 60, h: 3600, d: 86400 };
    local step(acc, c) =
      if std.member('0123456789', c) then acc { digits+: c }
      else acc { total+: std.parseInt(acc.digits) * units[c], digits: '' };
    std.foldl(step, std.stringChars(d), { total: 0, digits: '' }).total,

  // Seconds (whole or fractional) as a Prometheus duration: 3570 -> '59m30s', 0.5 -> '500ms'.
  duration(s)::
    local ms = std.floor(s * 1000 + 0.5);
    if ms % 1000 != 0 then '%dms' % ms
    else
      local whole = ms / 1000, h = std.floor(whole / 3600), m = std.floor((whole % 3600) / 60), sec = whole % 60;
      local text = (if h > 0 then '%dh' % h else '') + (if m > 0 then '%dm' % m else '') + (if sec > 0 then '%ds' % sec else '');
      if text == '' then '0s' else text,

  // A multi-line expression nested one level (two spaces) deeper inside another, its
  // trailing newline dropped: the caller's template supplies the first line's indent.
  indent(text):: std.strReplace(std.rstripChars(text, '\n'), '\n', '\n  '),

  // A fault that stopped something working after it worked: "worked" is "seen working
  // within the look-back, or already alerted". The ALERTS term keeps a port or link that
  // stays down alerting under this name, and its inhibitions in force, for as long as it
  // lasts, not only for the look-back.
  alertedOrWasWorking(name, working):: |||
    %(working)s
    or
    ALERTS{alertname="%(name)s"}
  ||| % { name: name, working: working },

  // The config's sections and the grouping labels, bound to one _config. Each is a
  // local, computed once: jsonnet evaluates an object field again on every access, and
  // the rules read these hundreds of times.
  context(cfg)::
    local node = cfg.nodeLabel;
    local byCfg(labels) = by(cfg, labels);
    local th = cfg.thresholds, w = cfg.windows, forOf = cfg['for'], sev = cfg.severities;
    local host = byCfg([node]), port = byCfg([node, 'device', 'port']), gpu = byCfg([node, 'gpu']);
    local link = byCfg([node, 'gpu', 'link']), rank = byCfg([node, 'comm', 'rank']);
    local comm = byCfg(['comm']), commNode = byCfg(['comm', node]);
    {
      cfg: cfg,
      th: th,  // thresholds
      w: w,  // windows
      forOf: forOf,  // for: durations
      sev: sev,  // severities
      node: node,
      cluster: cfg.clusterLabel,
      num: num,
      by: byCfg,
      // Grouping labels, each with the cluster label first.
      host: host,
      port: port,
      gpu: gpu,
      link: link,
      rank: rank,
      comm: comm,
      commNode: commNode,

      // Every alert: CamelCase with the `Fabric` prefix, a `severity` label (critical
      // pages, warning tickets, info routes nowhere), a one-sentence summary, a templated
      // description and a runbook_url (docs/runbooks/<AlertName>.md). keepFiringFor holds
      // it that long after its expression clears; annotations adds to the three above.
      alert(name, severity, expr, forDuration, summary, description, keepFiringFor=null, annotations={}):: {
        alert: name,
        expr: expr,
        'for': forDuration,
        labels: { severity: severity },
        annotations: {
          summary: summary,
          description: description,
          runbook_url: cfg.runbookUrlBase + name + '.md',
        } + annotations,
      } + (if keepFiringFor == null then {} else { keep_firing_for: keepFiringFor }),
    },
}
