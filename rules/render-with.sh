#!/bin/sh
# Render the rules with config overrides into another directory:
#   rules/render-with.sh <overrides.json> <outdir>
# <overrides.json> is deep-merged into mixin/config.libsonnet's _config; unknown keys and
# wrongly typed values are refused. Example (a fast demo):
#   {"for": {"ncclHang": "10s"}, "windows": {"tcpBaseline": "1m"}}
set -eu
if [ $# -ne 2 ]; then
	echo "usage: $0 <overrides.json> <outdir>" >&2
	exit 2
fi
overrides=$1
outdir=$2
here=$(cd "$(dirname "$0")" && pwd)
[ -r "$overrides" ] || { echo "$0: cannot read $overrides" >&2; exit 2; }
mkdir -p "$outdir"
exec "${JSONNET:-jsonnet}" -S -m "$outdir" --tla-code-file "overrides=$overrides" "$here/render.jsonnet" >/dev/null
