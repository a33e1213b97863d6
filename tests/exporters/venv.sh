#!/usr/bin/env bash
# Make (or reuse) the exporter venv NAME from requirements-NAME.txt beside this script and print its
# python.  Exporters are fixture tools, never project dependencies: each gets a venv of its own
# (optimum-onnx pins transformers < 4.58, the ONNX Runtime GenAI builder wants 5.x), kept outside
# the repository in $MCPC_EXPORTER_VENVS (default ${XDG_CACHE_HOME:-~/.cache}/mcpc/venvs).  A venv
# is rebuilt when its requirements file changed since it was made.
#
#   tests/exporters/venv.sh optimum      # -> .../venvs/optimum/bin/python
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
name=${1:?usage: venv.sh NAME (requirements-NAME.txt beside this script)}
req=$here/requirements-$name.txt
[ -f "$req" ] || { echo "venv.sh: no $req" >&2; exit 2; }
root=${MCPC_EXPORTER_VENVS:-${XDG_CACHE_HOME:-$HOME/.cache}/mcpc/venvs}
venv=$root/$name
if ! cmp -s "$req" "$venv/.requirements" 2>/dev/null; then
  echo "venv.sh: making $venv from $(basename "$req") (minutes)" >&2
  python3 -m venv "$venv"
  # torch first and alone: exactly 2.13.0 takes the CPU build on this machine's disk; a looser
  # request pulled in by another package would download a CUDA build of several GB
  "$venv/bin/pip" install --quiet --disable-pip-version-check torch==2.13.0 >&2
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$req" >&2
  cp "$req" "$venv/.requirements"
fi
echo "$venv/bin/python"
