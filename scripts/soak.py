#!/usr/bin/env python3
"""Soak and chaos runs of a real `sluice serve` (see scripts/soak.sh, which runs this).

1. Capacity of the `digits` app (closed loop, concurrency 64), then open-loop load at 2x and
   5x that for the given seconds each, every request a batch of IMAGES held-out images
   (default 128: one image costs the server about as much to serve as a refusal costs it,
   64-170 us against 30-45, so at 5x one CPU could not even refuse what arrives; a batch
   costs ~15 refusals, as requests of real models do): how fast refusals come back, admitted requests'
   latency against their deadline, the server's RSS and open descriptors every second, and
   the health endpoint's answer time every 200 ms while it lasts.
2. 1,000 trapping requests (the hostile guest's `trap`): RSS and descriptors before and after.
3. SIGKILL at a random point of 20 uploads and traffic changes, a restart after each: every
   restart must serve, with each acknowledged change present and the state consistent.

Prints Markdown for BENCHMARKS.md and exits non-zero when a bound does not hold. Needs the
release build and the test guests (`cargo build --release` builds both) and, for ONNX
Runtime, ./.venv from the tests. The server runs on CPU 0, the load on CPU 1 when there are two;
SOAK_SERVER_ARGS adds `sluice serve` options (say `--io-poll-interval 16`).

Usage: soak.py [SECONDS] [IMAGES]
"""

import glob
import hashlib
import http.client
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SLUICE = os.environ.get("SLUICE_BIN", os.path.join(ROOT, "target/release/sluice"))
GUESTS = os.path.join(ROOT, "target/guests/wasm32-wasip2/release")
KEY = "soak-key"
DEADLINE_MS = 1000
TWO_CPUS = (os.cpu_count() or 1) >= 2
failures = []


def check(condition, what):
    if not condition:
        failures.append(what)
    return condition


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def write_tenants(directory):
    model = os.path.join(ROOT, "examples/digits/model/digits.onnx")
    manifest = f"""version = 1
id = "soak"
api_key_sha256 = ["{hashlib.sha256(KEY.encode()).hexdigest()}"]

[quotas]
guest_deadline_ms = {DEADLINE_MS}
max_concurrent_requests = 100000
max_component_bytes = 100000000

[models.digits-mlp]
path = "{model}"
sha256 = "{sha256(model)}"

[apps.digits]
stable = "1"
versions."1".component = "{GUESTS}/digits.wasm"

[apps.hostile]
stable = "1"
versions."1".component = "{GUESTS}/hostile_guest.wasm"
"""
    with open(os.path.join(directory, "soak.toml"), "w") as f:
        f.write(manifest)


def onnxruntime_args():
    found = sorted(glob.glob(os.path.join(ROOT, "target/onnxruntime/libonnxruntime.so.*")))
    return ["--onnxruntime-lib", found[-1]] if found else []


class Server:
    def __init__(self, tenants, data):
        self.tenants, self.data = tenants, data
        self.process = None

    def start(self):
        command = [SLUICE, "serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--metrics", "127.0.0.1:0",
                   "--tenants", self.tenants, "--data-dir", self.data] + onnxruntime_args() + \
            os.environ.get("SOAK_SERVER_ARGS", "").split()
        if TWO_CPUS:
            command = ["taskset", "-c", "0"] + command
        log = open(os.path.join(os.path.dirname(self.data), "server.log"), "ab")
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, env={**os.environ, "SLUICE_LOG": "warn"})
        deadline = time.time() + 120
        while time.time() < deadline:
            line = self.process.stdout.readline().decode()
            if not line:
                raise RuntimeError(f"the server exited ({self.process.wait()}); see {log.name}")
            if line.startswith("listening on "):
                self.base = line.split()[-1]
            if line.startswith("metrics listening on "):
                self.metrics = line.split()[-1]
            if line.startswith("grpc listening on "):
                return self
        raise RuntimeError("the server did not start in 120 s")

    @property
    def pid(self):
        return self.process.pid

    def kill(self):
        self.process.kill()
        self.process.wait()

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=60)


def request(method, url, body=None, timeout=10):
    """(status, body); status 0 when the connection failed (a server killed mid-request)."""
    req = urllib.request.Request(url, data=body, method=method, headers={"Authorization": f"Bearer {KEY}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()
    except OSError:
        return 0, b""


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS:")).split()[1]) / 1024


def descriptors(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def digit_request(directory, images):
    """An OIP request for the digits app: the first `images` held-out images, one batch."""
    with open(os.path.join(ROOT, "examples/digits/testdata/heldout.json")) as f:
        heldout = json.load(f)["images"]
    data = [pixel for image in heldout[:images] for pixel in image]
    path = os.path.join(directory, "digit.json")
    with open(path, "w") as f:
        json.dump({"inputs": [{"name": "image", "shape": [images, 64], "datatype": "UINT8", "data": data}]}, f)
    return path


INPUT = None


def perf(server, extra):
    command = [SLUICE, "perf", "--address", server.base.removeprefix("http://"), "--model", "digits", "--key", KEY,
               "--input", INPUT] + extra
    if TWO_CPUS:
        command = ["taskset", "-c", "1"] + command
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout


def rows(text):
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| tenant") and not line.startswith("| ---")]


def ms(cell):
    return float(cell.split()[0]) if cell not in ("-", "") else float("nan")


def overload(server, capacity, factor, seconds):
    samples, health = [], []
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            samples.append((rss_mib(server.pid), descriptors(server.pid)))
            stop.wait(1.0)

    def probe():
        # On the metrics port, whose thread is its own, and from another address (127.0.0.2),
        # as a kubelet's probe would come (the load's connections are capped per address).
        host, port = server.metrics.removeprefix("http://").rsplit(":", 1)
        while not stop.is_set():
            started = time.perf_counter()
            try:
                connection = http.client.HTTPConnection(host, int(port), timeout=5, source_address=("127.0.0.2", 0))
                connection.request("GET", "/v2/health/ready")
                status = connection.getresponse().status
                connection.close()
            except OSError:
                status = 0
            health.append(((time.perf_counter() - started) * 1e3, status))
            stop.wait(0.2)

    threads = [threading.Thread(target=sample), threading.Thread(target=probe)]
    for thread in threads:
        thread.start()
    text = perf(server, ["--rate", str(capacity * factor), "--warmup-s", "1", "--duration-s", str(seconds), "--refusals"])
    stop.set()
    for thread in threads:
        thread.join()
    table = rows(text)
    served, refused = table[0], (table[1] if len(table) > 1 else None)
    ok, errors = int(served[1]), served[2]
    failed = int(refused[1]) if refused else 0
    health_ms = sorted(h for h, _ in health)
    health_p99 = health_ms[int((len(health_ms) - 1) * 0.99)] if health_ms else float("nan")
    result = {
        "factor": factor,
        "offered": (ok + failed) / seconds,
        "ok": ok,
        "errors": errors,
        "ok_p99": ms(served[6]),
        "refused_p99": ms(refused[3]) if refused else float("nan"),
        "refused_max": ms(refused[4]) if refused else float("nan"),
        "rss": (min(s[0] for s in samples), max(s[0] for s in samples)),
        "fds": (min(s[1] for s in samples), max(s[1] for s in samples)),
        "health_p99": health_p99,
        "health_max": health_ms[-1] if health_ms else float("nan"),
        "health_failed": sum(1 for _, status in health if status != 200),
    }
    check(result["refused_p99"] != result["refused_p99"] or result["refused_p99"] < 10,
          f"{factor}x: refusals p99 {result['refused_p99']} ms (want < 10)")
    check(result["ok_p99"] <= DEADLINE_MS, f"{factor}x: admitted p99 {result['ok_p99']} ms past the {DEADLINE_MS} ms deadline")
    check(health_p99 < 10, f"{factor}x: health p99 {health_p99:.1f} ms (want < 10)")
    check(result["health_failed"] == 0, f"{factor}x: {result['health_failed']} health checks failed")
    check(result["fds"][1] < 16384 + 256, f"{factor}x: {result['fds'][1]} descriptors open")
    return result


def trapping(server, count=1000):
    body = json.dumps({"inputs": [], "parameters": {"mode": "trap"}}).encode()
    url = f"{server.base}/v2/models/hostile/infer"
    for _ in range(50):  # warm the pool and the allocator first
        request("POST", url, body)
    time.sleep(0.5)
    before = (rss_mib(server.pid), descriptors(server.pid))
    statuses = {}
    for _ in range(count):
        status, _ = request("POST", url, body)
        statuses[status] = statuses.get(status, 0) + 1
    time.sleep(0.5)
    after = (rss_mib(server.pid), descriptors(server.pid))
    check(statuses == {500: count}, f"trapping requests answered {statuses}")
    check(after[0] - before[0] < 20, f"1000 traps grew RSS by {after[0] - before[0]:.1f} MiB")
    check(after[1] <= before[1], f"1000 traps left {after[1] - before[1]} descriptors open")
    return {"statuses": statuses, "before": before, "after": after}


def chaos(root, rounds=20):
    tenants, data = os.path.join(root, "tenants"), os.path.join(root, "chaos-data")
    os.makedirs(data)
    rng = random.Random(13)
    components = [os.path.join(GUESTS, name) for name in ("digits.wasm", "hostile_guest.wasm", "cascade.wasm")]
    acknowledged = set()
    kills = []
    for round_ in range(rounds):
        server = Server(tenants, data).start()
        ok = check(request("GET", f"{server.base}/control/v1/apps/digits")[0] == 200, f"round {round_}: no app after restart")
        status = json.loads(request("GET", f"{server.base}/control/v1/apps/digits")[1]) if ok else {}
        versions = set(status.get("versions", {}))
        check(acknowledged <= versions, f"round {round_}: acknowledged versions {sorted(acknowledged - versions)} lost")
        for version in versions:
            pinned = request("GET", f"{server.base}/v2/models/digits/versions/{version}")[0]
            check(pinned == 200, f"round {round_}: version {version} is listed but does not serve ({pinned})")
        check(not os.listdir(os.path.join(data, "registry/tmp")), f"round {round_}: temp files left after restart")
        version = str(round_ + 2)
        delay = rng.uniform(0.0, 0.4)
        action = rng.choice(["upload", "upload", "traffic"]) if len(versions) > 1 else "upload"
        done = {}

        def act():
            if action == "upload":
                with open(rng.choice(components), "rb") as f:
                    body = f.read()
                code, _ = request("PUT", f"{server.base}/control/v1/apps/digits/versions/{version}", body, timeout=30)
                done["code"] = code
            else:
                canary = rng.choice(sorted(versions - {"1"}))
                traffic = {"stable": "1", "canary": {"version": canary, "weight": rng.randint(1, 50)}}
                done["code"] = request("PUT", f"{server.base}/control/v1/apps/digits/traffic", json.dumps(traffic).encode())[0]

        worker = threading.Thread(target=act)
        worker.start()
        time.sleep(delay)
        server.kill()
        worker.join()
        if action == "upload" and done.get("code") == 201:
            acknowledged.add(version)
        kills.append((action, round(delay * 1000), done.get("code", "killed first")))
    server = Server(tenants, data).start()
    final = json.loads(request("GET", f"{server.base}/control/v1/apps/digits")[1])
    check(acknowledged <= set(final["versions"]), "the final restart lost acknowledged versions")
    server.stop()
    return {"kills": kills, "acknowledged": sorted(acknowledged, key=int), "final": sorted(final["versions"], key=int)}


def main():
    global INPUT
    seconds = int(sys.argv[1]) if len(sys.argv) > 1 else 60
    images = int(sys.argv[2]) if len(sys.argv) > 2 else 128
    with tempfile.TemporaryDirectory() as root:
        INPUT = digit_request(root, images)
        tenants = os.path.join(root, "tenants")
        os.makedirs(tenants)
        write_tenants(tenants)
        server = Server(tenants, os.path.join(root, "data")).start()
        capacity_text = perf(server, ["--concurrency", "64", "--warmup-s", "2", "--duration-s", "10"])
        capacity = float(rows(capacity_text)[0][3])
        results = [overload(server, capacity, factor, seconds) for factor in (2, 5)]
        traps = trapping(server)
        server.stop()
        chaos_result = chaos(root)

    print(f"Capacity of the `digits` app (closed loop, concurrency 64, {images} images a request): {capacity:.0f} req/s.\n")
    print("| load | offered (req/s) | ok | errors | ok p99 | refused p99 / max | RSS MiB (min-max) | fds (min-max) | health p99 / max | health failed |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        print(f"| {r['factor']}x | {r['offered']:.0f} | {r['ok']} | {r['errors']} | {r['ok_p99']:.2f} ms | "
              f"{r['refused_p99']:.2f} / {r['refused_max']:.2f} ms | {r['rss'][0]:.0f}-{r['rss'][1]:.0f} | "
              f"{r['fds'][0]}-{r['fds'][1]} | {r['health_p99']:.2f} / {r['health_max']:.2f} ms | {r['health_failed']} |")
    print(f"\n1,000 trapping requests: answered {traps['statuses']}; RSS {traps['before'][0]:.1f} -> "
          f"{traps['after'][0]:.1f} MiB, descriptors {traps['before'][1]} -> {traps['after'][1]}.\n")
    print(f"SIGKILL during {len(chaos_result['kills'])} uploads and traffic changes (action, ms after it began, its answer):")
    print(", ".join(f"{a} {d} ms {c}" for a, d, c in chaos_result["kills"]))
    print(f"\nAcknowledged versions {chaos_result['acknowledged']}; after the last restart {chaos_result['final']}.")
    if failures:
        print("\nFAILED:\n- " + "\n- ".join(failures))
        sys.exit(1)
    print("\nEvery bound held.")


if __name__ == "__main__":
    main()
