"""A real Prometheus (Debian's `prometheus` binary) scrapes a real kvtrimd under a short load,
with kvtrim's recording rules loaded; then every query of the Grafana dashboard, of its
template variables and of docs/metrics.md's "Useful queries" must return data, and so must
every recording rule. Skipped where the prometheus binary is not installed."""

import json
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import prometheus_rules  # noqa: E402
import soak_server  # noqa: E402

BUILD = pathlib.Path(os.environ.get("KVTRIM_BUILD_DIR", ROOT / "build"))
KVTRIMD = BUILD / "service" / "kvtrimd"
KVTRIM_CLI = BUILD / "client" / "kvtrim"
SAMPLE = ROOT / "samples" / "stories260k_prefill.safetensors"
BUNDLE = ROOT / "samples" / "stories260k_model.safetensors"
PROMETHEUS = shutil.which("prometheus")
# Grafana's variables, as the dashboard's "All" and a short rate window.
VARIABLES = {"$namespace": ".*", "$pod": ".*", "$policy": ".*", "$__rate_interval": "1m"}
SCRAPE_S = 1


def dashboard_queries():
    """Every `expr` of deploy/grafana/kvtrim-dashboard.json, with its panel's title."""
    found = []

    def walk(node, title):
        if isinstance(node, dict):
            title = node.get("title", title)
            if "expr" in node:
                found.append((title, node["expr"]))
            for value in node.values():
                walk(value, title)
        elif isinstance(node, list):
            for value in node:
                walk(value, title)

    walk(json.loads((ROOT / "deploy/grafana/kvtrim-dashboard.json").read_text()), "")
    return found


def documented_queries():
    """The queries of docs/metrics.md's "Useful queries" block: each starts after a comment
    line and runs to the next one."""
    text = (ROOT / "docs/metrics.md").read_text()
    block = re.search(r"## Useful queries\s+```promql\n(.*?)```", text, re.S).group(1)
    queries, current, comment = [], [], ""
    for line in block.splitlines():
        if line.startswith("#"):
            if current:
                queries.append((comment, " ".join(current)))
            current, comment = [], line
        elif line.strip():
            current.append(line.strip())
    if current:
        queries.append((comment, " ".join(current)))
    return queries


def substitute(expr):
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    return expr


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(port, path, **params):
    url = f"http://127.0.0.1:{port}{path}?{urllib.parse.urlencode(params, doseq=True)}"
    with urllib.request.urlopen(url, timeout=10) as response:
        answer = json.loads(response.read())
    assert answer["status"] == "success", answer
    return answer["data"]


def start_prometheus(directory, metrics_address):
    """Prometheus scraping `metrics_address` every second as job="kvtrim" in namespace kvtrim,
    with the recording rules evaluated every second too. The web port is picked free just
    before the start; a start that loses it to another process is retried on a new one."""
    rules = prometheus_rules.rule_file(
        yaml.safe_load((ROOT / "deploy/prometheus/kvtrim-rules.yaml").read_text()))
    for group in rules["groups"]:
        group["interval"] = f"{SCRAPE_S}s"
    (directory / "kvtrim.rules.yml").write_text(yaml.safe_dump(rules, sort_keys=False))
    config = {
        "global": {"scrape_interval": f"{SCRAPE_S}s", "evaluation_interval": f"{SCRAPE_S}s"},
        "rule_files": [str(directory / "kvtrim.rules.yml")],
        "scrape_configs": [{
            "job_name": "kvtrim",
            "static_configs": [{"targets": [metrics_address],
                                "labels": {"namespace": "kvtrim", "pod": "kvtrim-0",
                                           "node": "node-0"}}]}],
    }
    (directory / "prometheus.yml").write_text(yaml.safe_dump(config))
    for attempt in range(5):
        port = free_port()
        log = open(directory / f"prometheus.{attempt}.log", "w")
        process = subprocess.Popen(
            [PROMETHEUS, f"--config.file={directory / 'prometheus.yml'}",
             f"--storage.tsdb.path={directory / f'tsdb.{attempt}'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and process.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=1) as r:
                    if r.status == 200:
                        return process, port
            except OSError:
                time.sleep(0.2)
        process.kill()
        process.wait()
        if "address already in use" not in (directory / f"prometheus.{attempt}.log").read_text():
            break
    pytest.fail("prometheus did not start: " +
                (directory / f"prometheus.{attempt}.log").read_text()[-2000:])


def wait_first_scrape(port):
    """Waits until Prometheus has scraped kvtrimd once (its targets are discovered some
    seconds after it is ready), so that the load below starts from a scraped baseline."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if get(port, "/api/v1/query", query='up{job="kvtrim"} == 1')["result"]:
            return
        time.sleep(0.2)
    pytest.fail("prometheus never scraped kvtrimd")


def load(target):
    """A few calls of every kind the dashboard shows: unary and session compressions of the
    sample (values and queries: perturbation too), one unknown policy (an error code), one
    model registration."""
    def cli(*args, ok=True):
        done = subprocess.run([str(KVTRIM_CLI), f"--target={target}", *args],
                              capture_output=True, text=True, timeout=120)
        assert (done.returncode == 0) == ok, done.stderr
    cli("register-model", f"--model={BUNDLE}")
    for policy in ("dropkv", "snapkv", "knorm"):
        cli("compress", f"--policy={policy}", "--keep_fraction=0.2", f"--input={SAMPLE}")
    cli("compress", "--policy=snapkv", "--keep_fraction=0.3", "--session", f"--input={SAMPLE}")
    cli("compress", "--policy=no_such_policy", "--keep_fraction=0.2", f"--input={SAMPLE}",
        ok=False)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    if PROMETHEUS is None:
        pytest.skip("no prometheus binary (apt-get install prometheus)")
    if not KVTRIMD.exists() or not KVTRIM_CLI.exists():
        pytest.skip(f"{KVTRIMD} or {KVTRIM_CLI} not built")
    directory = tmp_path_factory.mktemp("prometheus")
    kvtrimd, paths = soak_server.start_kvtrimd(str(KVTRIMD), str(directory), [], {})
    try:
        addresses = soak_server.wait_ready(kvtrimd, paths["port_file"], 60)
        process, port = start_prometheus(directory, addresses["metrics"])
        try:
            wait_first_scrape(port)
            # Two rounds of load several scrapes apart, so that every rate() sees a rise.
            for _ in range(2):
                load(addresses["grpc"])
                time.sleep(4 * SCRAPE_S)
            time.sleep(3 * SCRAPE_S)  # the recording rules' evaluations after the last scrape
            yield port
        finally:
            process.terminate()
            process.wait(30)
    finally:
        soak_server.stop_kvtrimd(kvtrimd, paths["port_file"], 30)


def test_every_dashboard_query_returns_data(prometheus):
    queries = dashboard_queries()
    assert len(queries) >= 25
    empty = [(title, expr) for title, expr in queries
             if not get(prometheus, "/api/v1/query", query=substitute(expr))["result"]]
    assert not empty, empty


def test_every_template_variable_has_values(prometheus):
    dashboard = json.loads((ROOT / "deploy/grafana/kvtrim-dashboard.json").read_text())
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if not isinstance(query, dict):
            continue  # the datasource picker
        match = re.fullmatch(r"label_values\((.*), (\w+)\)", query["query"])
        series, label = substitute(match.group(1)), match.group(2)
        values = get(prometheus, f"/api/v1/label/{label}/values", **{"match[]": series})
        assert values, variable["name"]


def test_every_documented_query_returns_data(prometheus):
    queries = documented_queries()
    assert len(queries) >= 6
    empty = [(comment, expr) for comment, expr in queries
             if not get(prometheus, "/api/v1/query", query=expr)["result"]]
    assert not empty, empty


def test_every_recording_rule_has_data(prometheus):
    groups = get(prometheus, "/api/v1/rules", type="record")["groups"]
    records = [rule["name"] for group in groups for rule in group["rules"]]
    assert len(records) >= 10
    empty = [name for name in records
             if not get(prometheus, "/api/v1/query", query=name)["result"]]
    assert not empty, empty


def adapter_query(rule, namespace, pods):
    """A Prometheus adapter rule's metricsQuery as the adapter sends it for `pods`."""
    matchers = f'namespace="{namespace}",pod=~"{"|".join(pods)}"'
    series = re.match(r"[a-z_:]+", rule["seriesQuery"].strip("'\"")).group(0)
    return (rule["metricsQuery"].replace("<<.LabelMatchers>>", matchers)
            .replace("<<.GroupBy>>", "pod").replace("<<.Series>>", series))


def test_every_autoscaler_metric_is_served_per_pod(prometheus):
    """The HorizontalPodAutoscaler's metrics come from the adapter's rules, and each rule finds
    kvtrimd's series and answers one finite value for the pod (the in-flight ratio within
    [0, 1], the admission wait >= 0)."""
    rules = yaml.safe_load(
        (ROOT / "deploy/prometheus-adapter/kvtrim-adapter-rules.yaml").read_text())["rules"]
    served = {rule["name"]["as"]: rule for rule in rules}
    hpa = yaml.safe_load((ROOT / "deploy/kubernetes/remote/hpa.yaml").read_text())
    wanted = [metric["pods"]["metric"]["name"] for metric in hpa["spec"]["metrics"]]
    assert wanted and set(wanted) <= set(served), (wanted, sorted(served))
    for name, rule in served.items():
        found = get(prometheus, "/api/v1/series", **{"match[]": rule["seriesQuery"].strip("'")})
        assert found, name
        answer = get(prometheus, "/api/v1/query",
                     query=adapter_query(rule, "kvtrim", ["kvtrim-0"]))["result"]
        assert [sample["metric"] for sample in answer] == [{"pod": "kvtrim-0"}], (name, answer)
        value = float(answer[0]["value"][1])
        assert value >= 0 and value != float("inf"), (name, value)
        if name == "kvtrim_inflight_ratio":
            assert value <= 1, value
