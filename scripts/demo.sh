#!/usr/bin/env bash
# The demo: Envoy with weir (envoy/envoy.yaml) on 127.0.0.1:10000, admin on :9901.
# Shows a per-user limit at work, then keeps serving until Ctrl-C.
# WEIR_DEMO_EXIT=1 stops after the demonstration (CI uses it).
set -euo pipefail
cd "$(dirname "$0")/.."
envoy=${ENVOY_BIN:-.tools/venv/bin/envoy}
log=$(mktemp -t weir-demo-envoy.XXXXXX.log)

for port in 10000 9901; do
  if (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null; then
    echo "port $port is already in use: stop whatever listens there (an earlier demo?)" >&2
    exit 1
  fi
done

"$envoy" -c envoy/envoy.yaml --concurrency 2 --disable-hot-restart --base-id 4242 -l info >"$log" 2>&1 &
envoy_pid=$!
trap 'kill $envoy_pid 2>/dev/null || true; wait $envoy_pid 2>/dev/null || true' EXIT

for _ in $(seq 100); do
  [ "$(curl -s 127.0.0.1:9901/ready 2>/dev/null)" = "LIVE" ] && break
  kill -0 $envoy_pid 2>/dev/null || { echo "Envoy exited; its log ($log):" >&2; tail -20 "$log" >&2; exit 1; }
  sleep 0.1
done
echo "Envoy with weir is up (pid $envoy_pid, log $log)."
echo
echo "Rule per-user: GCRA, 10 requests/minute with a burst of 4 (5 at once), keyed by x-user."
echo "\$ for i in \$(seq 7); do curl -s -o /dev/null -w '%{http_code} ' -H 'x-user: alice' 127.0.0.1:10000/api/orders; done"
for _ in $(seq 7); do curl -s -o /dev/null -w '%{http_code} ' -H 'x-user: alice' 127.0.0.1:10000/api/orders; done
echo; echo
echo "The 429 alice gets now:"
echo "\$ curl -i -H 'x-user: alice' 127.0.0.1:10000/api/orders"
curl -si -H 'x-user: alice' 127.0.0.1:10000/api/orders | grep -v '^date:'
echo; echo
echo "bob has a bucket of his own:"
echo "\$ curl -i -H 'x-user: bob' 127.0.0.1:10000/api/orders"
curl -si -H 'x-user: bob' 127.0.0.1:10000/api/orders | grep -v '^date:'
echo
echo "weir's stats:"
echo "\$ curl -s 127.0.0.1:9901/stats | grep 'weir.rule.per-user'"
curl -s 127.0.0.1:9901/stats | grep 'weir.rule.per-user'

if [ "${WEIR_DEMO_EXIT:-0}" = "1" ]; then
  exit 0
fi
echo
echo "Envoy keeps serving on 127.0.0.1:10000 (admin 127.0.0.1:9901). Ctrl-C to stop."
wait $envoy_pid
