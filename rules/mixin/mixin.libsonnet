// The fabricscope monitoring mixin: config + recording rules + alerts.
//   prometheusRules   recording rule groups (rules/<area>.libsonnet, listed in rules/rules.libsonnet)
//   prometheusAlerts  alerting rule groups (alerts/<area>.libsonnet, listed in alerts/alerts.libsonnet)
//   withOverrides(o)  the same mixin with `o` deep-merged into _config
// The helpers the area files share (alert(), grouping labels, number formatting) are
// lib/utils.libsonnet.
(import 'config.libsonnet')
+ (import 'rules/rules.libsonnet')
+ (import 'alerts/alerts.libsonnet')
+ {
  local mixin = self,

  // The windows over which the exporter computes a histogram's quantile itself
  // (window_quantile in exporter/bpf/*.yaml: defined there, once). rules/render.py reads
  // them and render.jsonnet sets this; a rule reads e.g. $._exporterWindows.tcpRttExcess
  // = {seconds, quantile, gauge}.
  _exporterWindows:: error 'the exporter windows come from exporter/bpf/*.yaml: render with rules/render.py',

  // Refuse override keys the config does not have and values of another type, so a
  // typo in a test harness fails loudly instead of silently rendering production
  // settings. Returns true or raises.
  local check(base, overrides, path) =
    if std.type(overrides) != 'object' then
      error 'config override at %s must be an object, got %s' % [if path == '' then '(top)' else path, std.type(overrides)]
    else
      std.foldl(function(ok, key)
        local where = if path == '' then key else path + '.' + key;
        if !std.objectHas(base, key) then
          error 'unknown config key: %s (known: %s)' % [where, std.join(', ', std.objectFields(base))]
        else if std.type(base[key]) == 'object' then
          ok && check(base[key], overrides[key], where)
        else if std.type(overrides[key]) != std.type(base[key]) then
          error 'config key %s must be a %s, got %s' % [where, std.type(base[key]), std.type(overrides[key])]
        else ok,
        std.objectFields(overrides), true),

  // The merged config is a local so it is computed once: jsonnet does not cache object
  // fields, and every rule reads _config many times.
  withOverrides(overrides)::
    assert check(mixin._config, overrides, '');
    local merged = std.mergePatch(mixin._config, overrides);
    mixin { _config:: merged },
}
