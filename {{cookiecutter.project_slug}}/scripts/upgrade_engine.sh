#!/usr/bin/env bash
# Move this project to another classifier-engine release, locks included, in one command:
#   scripts/upgrade_engine.sh 1.6.0                     # from the package index
#   scripts/upgrade_engine.sh 1.6.0 'git+https://github.com/<owner>/<repo>@<commit>#subdirectory=classifier-engine'
#   scripts/upgrade_engine.sh 1.6.0 file:///path/to/template/classifier-engine
# It sets the release (and where it comes from) in both lock files, then refreshes every other pin against
# it with scripts/lock.sh. pyproject.toml's range (classifier-engine>=1.6,<2) admits every 1.x release;
# a 2.0 needs that range moved too, by hand, after reading the changelog.
# Then: pip install -c constraints.txt -e ".[dev]" && pytest
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:?"usage: scripts/upgrade_engine.sh VERSION [SOURCE]  (SOURCE: a git+https:// or file:// URL)"}
source=${2:-}
# A release the resolver refuses leaves both locks as they were.
for lock in constraints.txt constraints-cpu.txt; do cp "$lock" "$lock.before"; done
trap 'for lock in constraints.txt constraints-cpu.txt; do [ -f "$lock.before" ] && mv "$lock.before" "$lock"; done' EXIT
for lock in constraints.txt constraints-cpu.txt; do
    grep -vE '^classifier-engine( @ |==)' "$lock" | awk -v pin="classifier-engine==${version}" -v from="${source}" '
        !done && /^[a-z]/ && $0 > "classifier-engine" { print pin; if (from != "") print "classifier-engine @ " from; done = 1 }
        { print }' > "$lock.new"
    mv "$lock.new" "$lock"
done
scripts/lock.sh --upgrade-package classifier-engine
rm constraints.txt.before constraints-cpu.txt.before  # resolved: keep the new locks
echo "classifier-engine ${version}${source:+ from ${source}}: pip install -c constraints.txt -e \".[dev]\" && pytest"
