// Renders the mixin to the rule files Prometheus loads (rules/render.py runs it):
//   jsonnet -S -m <outdir> [--tla-code overrides='{...}'] --tla-code exporterWindows='{...}' rules/render.jsonnet
// `overrides` is deep-merged into mixin/config.libsonnet's _config (see docs/rules.md);
// `exporterWindows` are the exporter's declared quantile windows (render.py reads them).
local mixin = import 'mixin/mixin.libsonnet';
local yaml = import 'mixin/yaml.libsonnet';

local header = |||
  # Generated from rules/mixin/*.libsonnet by `make -C rules render`. Do not edit:
  # change the mixin and re-render.
|||;

local manifest(rules) = header + yaml.ruleFile(rules);

function(overrides={}, exporterWindows)
  local m = mixin.withOverrides(overrides) { _exporterWindows:: exporterWindows };
  {
    'fabricscope-recording.yaml': manifest(m.prometheusRules),
    'fabricscope-alerts.yaml': manifest(m.prometheusAlerts),
  }
