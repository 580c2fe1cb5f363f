#!/usr/bin/env bash
# The workflow's `matrix` job: print the jobs of ci/matrix.toml for a GitHub event as the Actions
# matrix, into $GITHUB_OUTPUT as `matrix=<json>` (and on the log, readable).
#   ci/matrix-output.sh EVENT [MARKERS]   MARKERS: a manual dispatch's -m expression (one ad-hoc job)
set -euo pipefail
cd "$(dirname "$0")/.."
event="${1:?usage: ci/matrix-output.sh EVENT [MARKERS]}"
json=$(python3 ci/matrix.py --event "$event" --markers "${2:-}")
python3 - "$json" <<'PY'
import json, sys
jobs = json.loads(sys.argv[1])["include"]
print(f"{len(jobs)} job(s):" if jobs else "no job for this event")
for j in jobs:
    print(f"  {j['name']}: -m {j['markers']!r} on [{', '.join(j['runs_on'])}], {j['gpus']} GPU(s), {j['timeout_minutes']} min")
PY
echo "matrix=$json" >>"${GITHUB_OUTPUT:-/dev/stdout}"
