#!/usr/bin/env bash
# A one-machine corral cluster, for trying it and for the README: a 3-member
# etcd (the real etcd, embedded in `corral etcd`), SeaweedFS as the shared
# layer store, two control instances and three nodes, each node in its own
# network namespace with its own data dir and cgroup parent. It runs a demo
# through the control plane and removes everything it made on exit (also on
# error or Ctrl-C). Needs root, `make build` and weed (scripts/deps.sh).
#
#   ./scripts/cluster.sh            # start, demo, clean up
#   KEEP=1 ./scripts/cluster.sh     # start, demo, keep running until Ctrl-C
#
# Names and ports are parameters so that several copies can share a host:
# CLUSTER_NAME (netns <name>-n0.., bridge crc<suffix>), CLUSTER_BASE_PORT
# (uses 24 ports from it), CLUSTER_SUBNET (a /24 prefix for the node network).
set -euo pipefail
cd "$(dirname "$0")/.."

NAME=${CLUSTER_NAME:-cl14}
BASE=${CLUSTER_BASE_PORT:-17540}
NET=${CLUSTER_SUBNET:-10.214.0}
BRIDGE=crc${NAME#cl}
WORK=$(mktemp -d /tmp/corral-cluster-XXXXXX)
BIN=$PWD/bin/corral
WEED=$(command -v weed || echo "$(go env GOPATH)/bin/weed")
HOSTIP=$NET.1
pids=()

[ "$(id -u)" = 0 ] || { echo "cluster.sh: run as root (namespaces, cgroups, mounts)" >&2; exit 1; }
[ -x "$BIN" ] || { echo "cluster.sh: no $BIN: run 'make build' first" >&2; exit 1; }
[ -x "$WEED" ] || { echo "cluster.sh: no weed: run scripts/deps.sh" >&2; exit 1; }

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

cleanup() {
  local rc=$?
  set +e
  if [ "$rc" != 0 ]; then
    for f in "$WORK"/*.log; do echo "--- $f (tail)"; tail -n 15 "$f"; done
  fi
  say "cleaning up"
  # Nodes first (--cleanup-on-exit deletes their sandboxes), then the rest.
  for i in 0 1 2; do [ -f "$WORK/node$i.pid" ] && kill -TERM "$(cat "$WORK/node$i.pid")" 2>/dev/null; done
  for i in 0 1 2; do
    if [ -f "$WORK/node$i.pid" ]; then
      p=$(cat "$WORK/node$i.pid")
      for _ in $(seq 1 600); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    fi
  done
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  for i in 0 1 2; do
    ip netns del "$NAME-n$i" 2>/dev/null
    ip link del "${NAME}n$i" 2>/dev/null
    for d in /sys/fs/cgroup/*/"corral-$NAME-n$i" /sys/fs/cgroup/"corral-$NAME-n$i"; do
      [ -d "$d" ] && rmdir "$d" 2>/dev/null
    done
  done
  ip link del "$BRIDGE" 2>/dev/null
  grep -q " $WORK" /proc/mounts && { echo "mounts left under $WORK:"; grep " $WORK" /proc/mounts; } || rm -rf "$WORK"
}
trap cleanup EXIT

say "node network: bridge $BRIDGE $HOSTIP/24, one namespace per node"
ip link add "$BRIDGE" type bridge
ip addr add "$HOSTIP/24" dev "$BRIDGE"
ip link set "$BRIDGE" up
for i in 0 1 2; do
  ns=$NAME-n$i
  ip netns add "$ns"
  ip link add "${NAME}n$i" type veth peer name eth0 netns "$ns"
  ip link set "${NAME}n$i" master "$BRIDGE" up
  ip -n "$ns" addr add "$NET.$((10 + i))/24" dev eth0
  ip -n "$ns" link set lo up
  ip -n "$ns" link set eth0 up
done

say "etcd: 3 members"
initial=""
for i in 0 1 2; do initial+="${initial:+,}m$i=http://$HOSTIP:$((BASE + 2 * i + 1))"; done
ETCD=""
for i in 0 1 2; do
  "$BIN" etcd --name "m$i" --data-dir "$WORK/etcd$i" --client-url "http://$HOSTIP:$((BASE + 2 * i))" \
    --peer-url "http://$HOSTIP:$((BASE + 2 * i + 1))" --initial-cluster "$initial" >"$WORK/etcd$i.log" 2>&1 &
  pids+=($!)
  ETCD+="${ETCD:+,}http://$HOSTIP:$((BASE + 2 * i))"
done

say "SeaweedFS (S3 on $HOSTIP:$((BASE + 12)))"
mkdir -p "$WORK/weed"
w=$((BASE + 6))
env -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY "$WEED" server -s3 -dir="$WORK/weed" -ip="$HOSTIP" -ip.bind="$HOSTIP" \
  -master.port=$w -master.port.grpc=$((w + 1)) -volume.port=$((w + 2)) -volume.port.grpc=$((w + 3)) \
  -filer.port=$((w + 4)) -filer.port.grpc=$((w + 5)) -s3.port=$((w + 6)) -s3.port.grpc=$((w + 7)) \
  -s3.port.iceberg=0 -s3.port.lance=0 -master.telemetry=false -master.volumeSizeLimitMB=1024 -volume.max=16 \
  >"$WORK/weed.log" 2>&1 &
pids+=($!)
S3=$HOSTIP:$((w + 6))
for _ in $(seq 1 120); do curl -s -o /dev/null -X PUT "http://$S3/corral-layers" && break; sleep 0.5; done

head -c 32 /dev/urandom | base64 >"$WORK/secret"
chmod 600 "$WORK/secret"

start_node() {
  local i=$1
  # nsenter, not `ip netns exec`: that remounts /sys, hiding the cgroup
  # hierarchies the node needs.
  nsenter --net="/run/netns/$NAME-n$i" "$BIN" serve --role node --etcd "$ETCD" --cluster-secret-file "$WORK/secret" \
    --advertise "$NET.$((10 + i)):$((BASE + 20))" --listen "" --data-dir "$WORK/node$i" \
    --cgroup-parent "corral-$NAME-n$i" --net-bridge "${BRIDGE}s$i" --lease-ttl 3s \
    --node-label "rack=r$i" --blob-store "s3://corral-layers?endpoint=$S3" --cleanup-on-exit \
    --log-level warn >>"$WORK/node$i.log" 2>&1 &
  echo $! >"$WORK/node$i.pid"
}
say "3 nodes, each in its own network namespace"
for i in 0 1 2; do start_node "$i"; done

say "2 control instances (127.0.0.1:$((BASE + 16)), :$((BASE + 17)))"
for i in 0 1; do
  "$BIN" serve --role control --etcd "$ETCD" --cluster-secret-file "$WORK/secret" \
    --listen "127.0.0.1:$((BASE + 16 + i))" --socket "$WORK/control$i.sock" --log-level warn >"$WORK/control$i.log" 2>&1 &
  pids+=($!)
done
# The sockets are the cluster administrator's; TCP callers send a token.
C0="--addr unix://$WORK/control0.sock"
C1="--addr unix://$WORK/control1.sock"
ready=0
for _ in $(seq 1 120); do
  ready=$("$BIN" $C0 nodes --json 2>/dev/null | grep -c '"state": "ready"' || true)
  [ "$ready" = 3 ] && break
  sleep 0.5
done
[ "$ready" = 3 ] || { echo "cluster.sh: only $ready of 3 nodes ready" >&2; exit 1; }
"$BIN" $C0 nodes

say "30 sandboxes through alternating control instances"
ids=()
for n in $(seq 1 30); do
  c=$C0; [ $((n % 2)) = 0 ] && c=$C1
  ids+=("$("$BIN" $c create --memory 32Mi -l demo=spread)")
done
printf '%s\n' "${ids[@]}" | cut -d- -f1 | sort | uniq -c | sed 's/^/  sandboxes on node: /'
"$BIN" $C1 exec "${ids[0]}" -- echo "exec through the other control instance works"
echo "  streamed stdin (exec -i) through a control instance works" | "$BIN" $C1 exec -i "${ids[0]}" -- cat

say "a project and its token made on control 0, used over TCP on control 1"
"$BIN" $C0 project create demo --max-sandboxes 5 >/dev/null
tok=$("$BIN" $C0 token create --project demo 2>/dev/null)
psb=$(CORRAL_TOKEN=$tok "$BIN" --addr "127.0.0.1:$((BASE + 17))" create --memory 32Mi)
echo "  $psb in project $("$BIN" $C0 get "$psb" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["project"])')"
"$BIN" --addr "127.0.0.1:$((BASE + 17))" nodes >/dev/null 2>&1 && { echo "cluster.sh: TCP without a token was served" >&2; exit 1; }

say "a layer made on node 0, a sandbox from it on node 2 (lazy fetch from S3)"
mkdir -p "$WORK/layer"
echo "made on node 0" >"$WORK/layer/hello.txt"
"$BIN" --addr "unix://$WORK/node0/corral.sock" layer create "$WORK/layer" --name demo@1 >/dev/null
for _ in $(seq 1 40); do "$BIN" $C0 image ls 2>/dev/null | grep -q demo@1 && break; sleep 0.5; done
"$BIN" $C0 image ls
sb=$("$BIN" $C0 create --image demo@1 --memory 32Mi --node-label rack=r2)
echo "  $sb (node ${sb%%-*}) reads: $("$BIN" $C1 cp "$sb:/hello.txt" -)"

say "drain node 1, create 6, undrain"
n1=$("$BIN" $C0 nodes --json | python3 -c 'import json,sys; print([n["id"] for n in json.load(sys.stdin) if n["labels"].get("rack")=="r1"][0])')
"$BIN" $C0 node drain "$n1"
for _ in $(seq 1 6); do "$BIN" $C1 create --memory 32Mi | cut -d- -f1; done | sort | uniq -c | sed 's/^/  while drained: /'
"$BIN" $C0 node drain --undo "$n1"

say "kill -9 node 2: its sandboxes become lost; back, they answer again"
victim=$(printf '%s\n' "${ids[@]}" | grep "^$("$BIN" $C0 nodes --json | python3 -c 'import json,sys; print([n["id"] for n in json.load(sys.stdin) if n["labels"].get("rack")=="r2"][0])')-" | head -1)
kill -9 "$(cat "$WORK/node2.pid")"
for _ in $(seq 1 40); do "$BIN" $C0 get "$victim" --json 2>/dev/null | grep -q '"lost"' && break; sleep 0.25; done
"$BIN" $C0 get "$victim" --json | grep -E "\"(state|stop_reason)\"" | sed "s/^ */  /"
echo "  listed lost (from the node's summary in etcd): $("$BIN" $C0 ls --state lost | grep -c -- "-")"
"$BIN" $C0 nodes
start_node 2
for _ in $(seq 1 120); do "$BIN" $C1 exec "$victim" -- true 2>/dev/null && break; sleep 0.5; done
"$BIN" $C1 exec "$victim" -- echo "  $victim answers again"

if [ -n "${KEEP:-}" ]; then
  say "cluster running: CORRAL_ADDR=unix://$WORK/control0.sock (Ctrl-C ends it)"
  while sleep 3600; do :; done
fi
