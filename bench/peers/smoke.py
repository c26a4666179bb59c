#!/usr/bin/env python3
"""The benchmark's peers start and limit: fails loudly when one does not.

    bench/peers/smoke.py ENVOY LIMITADOR_RLS

For each of limitador's Redis storages (async, cached): a standalone redis-server, the
limitador-rls adapter over it (3 hits a minute per `x-user`), and an Envoy whose global
rate limit filter (`envoy.filters.http.ratelimit`) calls it; user a's five requests must
get 200, 200, 200, 429, 429 and user b's two 200s. Everything listens on 127.0.0.1, in a
temporary directory, and is stopped by PID at the end.

Envoy's rate limit filter does nothing on a `direct_response` route (it rate-limits
routes to a cluster), so the request goes to a second listener of the same Envoy that
answers 200.

Then Envoy's own local rate limit filter (`envoy.filters.http.local_ratelimit`) splitting
one fleet-wide bucket with `local_cluster_rate_limit`: two Envoys, each with a bucket of 10
(refilled once a minute, so not during the check) and a bootstrap local cluster
(`cluster_manager.local_cluster_name`) listing both, must each admit 5 and then answer 429;
an Envoy alone in its local cluster admits all 10. Envoy computes the share as 1 / the
local cluster's `membership_total` (every host, healthy or not, whether or not it is this
Envoy) and charges each request 1 / share tokens from the full bucket. The local rate limit
filter, unlike the rate limit filter, does act on a `direct_response` route.
"""
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, what, seconds=20):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"peers smoke: {what} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.1)
    sys.exit(f"peers smoke: {what} did not listen on {port} within {seconds} s")


HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
ROUTER = '{ name: envoy.filters.http.router, typed_config: { "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router } }'


def endpoint(port):
    return f"{{ endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }} }} }}"


def listener(name, port, route, filters):
    """A listener list item (under `listeners:`) with one HTTP connection manager whose
    only route is `route`, and `filters` (YAML list items at the filters' indent) before
    the router."""
    return f"""  - name: {name}
    address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": {HCM}
          stat_prefix: {name}
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes: [ {route} ]
          http_filters:
{filters}          - {ROUTER}
"""


def envoy_config(port, backend, rls, admin):
    ratelimit = """          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: bench
              failure_mode_deny: true
              timeout: 1s
              rate_limit_service:
                transport_api_version: V3
                grpc_service: { envoy_grpc: { cluster_name: rls } }
"""
    limited = ('{ match: { prefix: "/" }, route: { cluster: backend, rate_limits: [ { actions: '
               '[ { request_headers: { header_name: x-user, descriptor_key: x-user } } ] } ] } }')
    answer = '{ match: { prefix: "/" }, direct_response: { status: 200 } }'
    return f"""
static_resources:
  listeners:
{listener("ingress", port, limited, ratelimit)}{listener("backend", backend, answer, "")}  clusters:
  - name: backend
    type: STATIC
    load_assignment:
      cluster_name: backend
      endpoints: [ {{ lb_endpoints: [ {endpoint(backend)} ] }} ]
  - name: rls
    type: STATIC
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{ http2_protocol_options: {{}} }}
    load_assignment:
      cluster_name: rls
      endpoints: [ {{ lb_endpoints: [ {endpoint(rls)} ] }} ]
admin:
  address: {{ socket_address: {{ address: 127.0.0.1, port_value: {admin} }} }}
"""


def status(port, user):
    request = urllib.request.Request(f"http://127.0.0.1:{port}/", headers={"x-user": user})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code


def stop(procs):
    for proc in reversed(procs):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()


def run(envoy, rls_bin, storage, work):
    ports = {name: free_port() for name in ("redis", "rls", "envoy", "backend", "admin")}
    procs = []

    def start(args, what):
        log = open(os.path.join(work, f"{what}.log"), "w")
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=work)
        procs.append(proc)
        return proc

    try:
        redis = start(["redis-server", "--port", str(ports["redis"]), "--bind", "127.0.0.1",
                       "--save", "", "--appendonly", "no"], "redis")
        wait_port(ports["redis"], redis, "redis-server")
        rls = start([rls_bin, "--listen", f"127.0.0.1:{ports['rls']}",
                     "--redis", f"redis://127.0.0.1:{ports['redis']}", "--storage", storage,
                     "--domain", "bench", "--key", "x-user", "--limit", "3", "--seconds", "60"],
                    f"limitador-rls-{storage}")
        wait_port(ports["rls"], rls, f"limitador-rls ({storage})")
        config = os.path.join(work, f"envoy-{storage}.yaml")
        with open(config, "w") as f:
            f.write(envoy_config(ports["envoy"], ports["backend"], ports["rls"], ports["admin"]))
        proxy = start([envoy, "-c", config, "--concurrency", "1", "-l", "warning",
                       "--base-id", str(ports["admin"])], f"envoy-{storage}")
        wait_port(ports["envoy"], proxy, "Envoy")
        got = ([status(ports["envoy"], "a") for _ in range(5)],
               [status(ports["envoy"], "b") for _ in range(2)])
        want = ([200, 200, 200, 429, 429], [200, 200])
        if got != want:
            sys.exit(f"peers smoke: limitador-rls ({storage}): users a and b got {got}, "
                     f"expected {want}; logs in {work}")
        print(f"peers smoke: limitador-rls ({storage} storage) behind Envoy's rate limit "
              f"filter: a {got[0]}, b {got[1]}")
    finally:
        stop(procs)


FLEET_BUCKET = 10


def fleet_envoy_config(port, admin, members):
    local_ratelimit = f"""          - name: envoy.filters.http.local_ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit
              stat_prefix: fleet
              token_bucket: {{ max_tokens: {FLEET_BUCKET}, tokens_per_fill: {FLEET_BUCKET}, fill_interval: 60s }}
              filter_enabled: {{ default_value: {{ numerator: 100, denominator: HUNDRED }} }}
              filter_enforced: {{ default_value: {{ numerator: 100, denominator: HUNDRED }} }}
              local_cluster_rate_limit: {{}}
"""
    answer = '{ match: { prefix: "/" }, direct_response: { status: 200 } }'
    endpoints = ", ".join(endpoint(member) for member in members)
    return f"""
cluster_manager: {{ local_cluster_name: fleet }}
static_resources:
  listeners:
{listener("ingress", port, answer, local_ratelimit)}  clusters:
  - name: fleet
    type: STATIC
    load_assignment:
      cluster_name: fleet
      endpoints: [ {{ lb_endpoints: [ {endpoints} ] }} ]
admin:
  address: {{ socket_address: {{ address: 127.0.0.1, port_value: {admin} }} }}
"""


def fleet(envoy, work, size):
    """`size` Envoys whose local cluster lists all of them; each must admit its share."""
    ports = [free_port() for _ in range(size)]
    share = FLEET_BUCKET // size
    procs = []
    try:
        for i, port in enumerate(ports):
            admin = free_port()
            config = os.path.join(work, f"envoy-fleet{size}-{i}.yaml")
            with open(config, "w") as f:
                f.write(fleet_envoy_config(port, admin, ports))
            log = open(os.path.join(work, f"envoy-fleet{size}-{i}.log"), "w")
            procs.append(subprocess.Popen(
                [envoy, "-c", config, "--concurrency", "1", "-l", "warning", "--base-id", str(admin)],
                stdout=log, stderr=subprocess.STDOUT, cwd=work))
        for proc, port in zip(procs, ports):
            wait_port(port, proc, f"Envoy {port} of a fleet of {size}")
        want = [200] * share + [429] * 2
        for port in ports:
            got = [status(port, "fleet") for _ in range(share + 2)]
            if got != want:
                sys.exit(f"peers smoke: local_cluster_rate_limit: Envoy {port} of a fleet of {size} "
                         f"sharing a bucket of {FLEET_BUCKET} got {got}, expected {want}; "
                         f"logs in {work}")
            print(f"peers smoke: Envoy's local rate limit filter, bucket of {FLEET_BUCKET} split "
                  f"across a fleet of {size} by local_cluster_rate_limit: Envoy {port} {got}")
    finally:
        stop(procs)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    envoy, rls_bin = sys.argv[1], os.path.abspath(sys.argv[2])
    with tempfile.TemporaryDirectory(prefix="weir-peers-") as work:
        for storage in ("async", "cached"):
            run(envoy, rls_bin, storage, work)
        for size in (2, 1):
            fleet(envoy, work, size)


if __name__ == "__main__":
    main()
