#!/usr/bin/env bash
# Tests the Python SDK (sdk/python) with Debian's python3 against a live
# daemon of its own: builds corral, starts `corral serve` on a temporary data
# dir, a free TCP port and its own cgroup parent, runs the unittest suite once
# over the unix socket and once over TCP (with an admin token of a project
# "pytest" made on the socket), then stops the daemon (SIGTERM,
# --cleanup-on-exit deletes every sandbox) and fails if any test failed.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
  echo "test-python.sh: run as root (the daemon creates namespaces, mounts and cgroups)" >&2
  exit 1
fi
PYTHON=${PYTHON:-/usr/bin/python3}
if ! [ -x "$PYTHON" ]; then
  apt-get install -y python3 >/dev/null
fi
make build

data_dir=$(mktemp -d /tmp/corral-pytest.XXXXXX)
port=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
sock="$data_dir/corral.sock"
log="$data_dir/serve.log"
cgroup_parent="corral-pytest-$RANDOM"
bin/corral serve --data-dir "$data_dir" --listen "127.0.0.1:$port" \
  --cgroup-parent "$cgroup_parent" --cleanup-on-exit --no-raise-limits --log-level warn >"$log" 2>&1 &
daemon=$!

stop_daemon() {
  if kill -0 "$daemon" 2>/dev/null; then
    kill -TERM "$daemon"
    wait "$daemon" || echo "test-python.sh: daemon exited with status $?" >&2
  fi
  # The daemon leaves its (empty) cgroup parent; rmdir fails on a non-empty one.
  for dir in /sys/fs/cgroup/*/"$cgroup_parent" /sys/fs/cgroup/"$cgroup_parent"; do
    [ -d "$dir" ] && rmdir "$dir" 2>/dev/null || true
  done
  # Remove the data dir only when the daemon left nothing mounted under it.
  if ! grep -q " $data_dir" /proc/mounts; then
    rm -rf "$data_dir"
  else
    echo "test-python.sh: mounts left under $data_dir:" >&2
    grep " $data_dir" /proc/mounts >&2
  fi
}
trap stop_daemon EXIT

for _ in $(seq 300); do
  if bin/corral --addr "unix://$sock" ls >/dev/null 2>&1; then
    break
  fi
  if ! kill -0 "$daemon" 2>/dev/null; then
    echo "test-python.sh: daemon died at start:" >&2
    cat "$log" >&2
    exit 1
  fi
  sleep 0.1
done

bin/corral --addr "unix://$sock" project create pytest >/dev/null
tcp_token=$(bin/corral --addr "unix://$sock" token create --project pytest --role admin 2>/dev/null)

status=0
export CORRAL_TEST_RUN_ID="pytest$RANDOM"
# One microVM snapshot → restore → fork per address (~15 s each under TCG).
export CORRAL_TEST_MICROVM=${CORRAL_TEST_MICROVM:-1}
for addr in "unix://$sock" "127.0.0.1:$port"; do
  echo "== Python SDK tests against $addr"
  token=""
  [[ $addr == unix://* ]] || token=$tcp_token
  CORRAL_TOKEN="$token" CORRAL_TEST_ADDR="$addr" "$PYTHON" -m unittest discover -s sdk/python/tests -v || status=1
done

left=$(PYTHONPATH=sdk/python "$PYTHON" -c '
import sys, corral
with corral.Client(sys.argv[1]) as c:
    print(len(c.list(labels={"corral-pytest": sys.argv[2]})))' "unix://$sock" "$CORRAL_TEST_RUN_ID")
if [ "$left" != 0 ]; then
  echo "test-python.sh: $left sandboxes of this run left behind" >&2
  status=1
fi
if [ "$status" != 0 ]; then
  echo "test-python.sh: FAILED; the daemon's log ends:" >&2
  tail -n 50 "$log" >&2
fi
exit "$status"
