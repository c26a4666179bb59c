#!/usr/bin/env bash
# The demo stack, all on 127.0.0.1:
#   Redis Cluster   6 nodes (3 masters, 3 replicas) on ports 7100-7105
#   weir-bridge     :8081
#   Envoy A         :10000 (admin :9901)  envoy/envoy.yaml
#   Envoy B         :10001 (admin :9902)  the same file, other ports
# Shows a local per-user limit, then a global per-tenant quota shared by both Envoys,
# then keeps serving until Ctrl-C. WEIR_DEMO_EXIT=1 stops after the demonstration.
# Everything it starts is stopped by PID when it exits.
set -euo pipefail
cd "$(dirname "$0")/.."
envoy=${ENVOY_BIN:-.tools/envoy}
bridge=${WEIR_BRIDGE_BIN:-target/debug/weir-bridge}
# The same overrides as the test harness (tests/src/prereq.rs), e.g. for a newer Redis.
redis_server=${REDIS_SERVER_BIN:-redis-server}
redis_cli=${REDIS_CLI_BIN:-redis-cli}
work=$(mktemp -d -t weir-demo.XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

for port in 7100 7101 7102 7103 7104 7105 8081 10000 10001 9901 9902; do
  if (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null; then
    echo "port $port is already in use: stop whatever listens there (an earlier demo?)" >&2
    exit 1
  fi
done

wait_for() { # what, command...
  local what=$1; shift
  for _ in $(seq 200); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "$what did not come up; logs in $work" >&2
  exit 1
}

echo "Starting a Redis Cluster (ports 7100-7105) in $work ..."
for port in 7100 7101 7102 7103 7104 7105; do
  mkdir -p "$work/redis-$port"
  "$redis_server" --port "$port" --bind 127.0.0.1 --cluster-enabled yes \
    --cluster-config-file "nodes-$port.conf" --cluster-node-timeout 1000 \
    --cluster-require-full-coverage no --save "" --appendonly no \
    --dir "$work/redis-$port" --protected-mode no >"$work/redis-$port.log" 2>&1 &
  pids+=($!)
done
for port in 7100 7101 7102 7103 7104 7105; do wait_for "redis :$port" "$redis_cli" -p "$port" ping; done
"$redis_cli" --cluster create 127.0.0.1:7100 127.0.0.1:7101 127.0.0.1:7102 \
  127.0.0.1:7103 127.0.0.1:7104 127.0.0.1:7105 --cluster-replicas 1 --cluster-yes >"$work/create.log" 2>&1
wait_for "the cluster" bash -c '"$0" -p 7100 cluster info | grep -q cluster_state:ok' "$redis_cli"

echo "Starting weir-bridge on 127.0.0.1:8081 ..."
"$bridge" --listen 127.0.0.1:8081 --redis-nodes 127.0.0.1:7100,127.0.0.1:7101,127.0.0.1:7102 \
  >"$work/bridge.log" 2>&1 &
pids+=($!)
wait_for "weir-bridge" curl -sf 127.0.0.1:8081/healthz

echo "Starting two Envoys with weir (127.0.0.1:10000 and 127.0.0.1:10001) ..."
sed -e 's/port_value: 10000/port_value: 10001/' -e 's/port_value: 9901/port_value: 9902/' \
  envoy/envoy.yaml >"$work/envoy-b.yaml"
"$envoy" -c envoy/envoy.yaml --concurrency 2 --disable-hot-restart --base-id 4242 -l info >"$work/envoy-a.log" 2>&1 &
pids+=($!)
"$envoy" -c "$work/envoy-b.yaml" --concurrency 2 --disable-hot-restart --base-id 4243 -l info >"$work/envoy-b.log" 2>&1 &
pids+=($!)
wait_for "Envoy A" bash -c '[ "$(curl -s 127.0.0.1:9901/ready)" = LIVE ]'
wait_for "Envoy B" bash -c '[ "$(curl -s 127.0.0.1:9902/ready)" = LIVE ]'
echo "Up. Logs in $work."
echo

show() { echo "\$ $*"; "$@" | grep -v '^date:'; echo; }

echo "== A local limit: per-user, GCRA 10/minute with a burst of 4 (5 at once), keyed by x-user."
echo "\$ for i in \$(seq 7); do curl -s -o /dev/null -w '%{http_code} ' -H 'x-user: alice' 127.0.0.1:10000/api/orders; done"
for _ in $(seq 7); do curl -s -o /dev/null -w '%{http_code} ' -H 'x-user: alice' 127.0.0.1:10000/api/orders; done
echo; echo
show curl -si -H 'x-user: alice' 127.0.0.1:10000/api/orders
echo "bob has a bucket of his own:"
show curl -s -o /dev/null -w '%{http_code}\n' -H 'x-user: bob' 127.0.0.1:10000/api/orders

echo "== A global quota: per-tenant, GCRA 20/minute with a burst of 10, shared by both Envoys"
echo "   through weir-bridge and Redis; the leases' 1 s hold costs one unit of the burst, so"
echo "   10 at once. Requests alternate between the two:"
echo "\$ for i in \$(seq 8); do for p in 10000 10001; do curl -s -o /dev/null -w \"\$p:%{http_code} \" -H 'x-tenant: acme' 127.0.0.1:\$p/tenant/reports; done; done"
for _ in $(seq 8); do
  for p in 10000 10001; do curl -s -o /dev/null -w "$p:%{http_code} " -H 'x-tenant: acme' "127.0.0.1:$p/tenant/reports"; done
done
echo; echo
echo "At most 10 pass across both Envoys (leases may leave a unit or two unspent). After a"
echo "denial each Envoy answers from its denial cache until the retry time, without Redis:"
show curl -si -H 'x-tenant: acme' 127.0.0.1:10001/tenant/reports
# weir sends its counters every 100 ms: let the last ones land.
sleep 0.3
echo "weir's stats on Envoy A and the bridge's:"
echo "\$ curl -s 127.0.0.1:9901/stats | grep -E 'weir\.[^.]+\.rule\.per-(user|tenant)\.(allowed|limited|lease_hits|denial_cache_hits|bridge_decisions)'"
curl -s 127.0.0.1:9901/stats | grep -E 'weir\.[^.]+\.rule\.per-(user|tenant)\.(allowed|limited|lease_hits|denial_cache_hits|bridge_decisions)'
echo "\$ curl -s 127.0.0.1:8081/metrics | grep '^weir_bridge_decisions'"
curl -s 127.0.0.1:8081/metrics | grep '^weir_bridge_decisions'

if [ "${WEIR_DEMO_EXIT:-0}" = "1" ]; then
  exit 0
fi
echo
echo "Serving: Envoys on 127.0.0.1:10000 and :10001 (admin :9901, :9902), bridge on :8081."
echo "Ctrl-C stops everything."
wait
