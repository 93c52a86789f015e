// A YAML writer for Prometheus rule files. std.manifestYamlDoc in jsonnet 0.18 sorts
// keys alphabetically (record after expr) and takes seconds with unquoted keys; rule
// files have a fixed shape, so write them directly, keys in the order people read them.
local ruleKeys = ['alert', 'record', 'expr', 'for', 'keep_firing_for', 'labels', 'annotations'];
local groupKeys = ['name', 'interval', 'rules'];

local quote(s) = std.escapeStringJson(s);

// Multi-line strings (expressions) as literal blocks; everything else double-quoted.
local scalar(value, indent) =
  if std.type(value) == 'string' && std.endsWith(value, '\n') then
    // A block whose first line is indented would need an indentation indicator.
    assert !std.startsWith(value, ' ') : 'multi-line value starts with a space: %s' % value;
    '|\n' + std.join('\n', [
      if line == '' then '' else indent + '  ' + line
      for line in std.split(std.rstripChars(value, '\n'), '\n')
    ])
  else if std.type(value) == 'string' then quote(value)
  else std.toString(value);

// Annotations read best summary first; other keys (labels) sorted.
local mapKeyOrder = ['summary', 'description', 'runbook_url'];
local map(object, indent) = std.join('\n', [
  indent + key + ': ' + quote(object[key])
  for key in [k for k in mapKeyOrder if std.objectHas(object, k)]
             + [k for k in std.objectFields(object) if std.count(mapKeyOrder, k) == 0]
]);

local rule(r) =
  local known = [key for key in ruleKeys if std.objectHas(r, key)];
  assert std.length(known) == std.length(std.objectFields(r)) : 'unexpected rule keys: %s' % std.objectFields(r);
  std.join('\n', [
    (if i == 0 then '  - ' else '    ') + known[i] + ':'
    + (if std.type(r[known[i]]) == 'object' then '\n' + map(r[known[i]], '      ')
       else ' ' + scalar(r[known[i]], '    '))
    for i in std.range(0, std.length(known) - 1)
  ]);

local group(g) =
  '- name: ' + quote(g.name) + '\n'
  // An empty interval leaves the group on Prometheus' global evaluation_interval.
  + (if std.objectHas(g, 'interval') && g.interval != '' then '  interval: ' + quote(g.interval) + '\n' else '')
  + '  rules:\n'
  + std.join('\n', [rule(r) for r in g.rules]);

{
  // `rules` is {groups: [...]}; returns the file text, ending in a newline.
  ruleFile(rules):: 'groups:\n' + std.join('\n', [group(g) for g in rules.groups]) + '\n',
}
