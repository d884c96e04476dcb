#!/usr/bin/env bash
# The demo: installs dependencies, builds corral, builds the Debian image
# (about a minute the first time, cached after), starts the daemon on the
# embedded default and runs dozens of sandboxed RL-style episodes through the
# Go SDK, then prints a summary and shuts everything down.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
  echo "demo.sh: run as root (corral creates namespaces, mounts and cgroups)" >&2
  exit 1
fi
DATA_DIR=${CORRAL_DATA_DIR:-/var/lib/corral}
EPISODES=${EPISODES:-48}
./scripts/deps.sh
make build
sock="$DATA_DIR/corral.sock"
bin/corral serve --data-dir "$DATA_DIR" --cleanup-on-exit --log-level warn &
daemon=$!
trap 'kill -TERM $daemon 2>/dev/null; wait $daemon' EXIT
for _ in $(seq 200); do
  bin/corral --addr "unix://$sock" ls >/dev/null 2>&1 && break
  sleep 0.1
done
bin/corral --addr "unix://$sock" image build debian
echo "daemon up; one-off sandbox:"
bin/corral --addr "unix://$sock" run --image debian -- python3 -c 'import platform; print("hello from", platform.platform())'
go run ./examples/rollout --addr "unix://$sock" --image debian --episodes "$EPISODES" --concurrency 8
