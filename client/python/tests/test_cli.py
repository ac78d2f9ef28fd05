"""The C++ CLI as a script uses it: --json on every command (answers on stdout, errors on
stderr, same exit codes), --version, per-command help, and `health --wait` against a kvtrimd
that starts after it."""

import json
import re
import subprocess
import threading
import time

import numpy as np

import kvtrim
from conftest import BUNDLE, KVTRIM_CLI, SAMPLE, Server

COMMANDS = ["health", "policies", "compress", "register-model", "models", "regions",
            "delete-model", "help"]


def cli(*args, timeout=120):
    """Runs the CLI; returns the completed process (text)."""
    return subprocess.run([str(KVTRIM_CLI), *args], capture_output=True, text=True,
                          timeout=timeout)


def json_of(process):
    """The one JSON object the command printed on stdout."""
    lines = process.stdout.splitlines()
    assert len(lines) == 1, process.stdout
    return json.loads(lines[0])


def test_version_names_the_release_and_the_commit():
    text = cli("--version")
    assert text.returncode == 0
    match = re.fullmatch(r"kvtrim (\d+\.\d+\.\d+) \(git ([0-9a-f]{7,40}(-dirty)?|unknown)\)\n",
                         text.stdout)
    assert match, text.stdout
    answer = json_of(cli("--json", "--version"))
    assert answer == {"version": match.group(1), "git_commit": match.group(2)}


def test_help_for_every_command_in_both_spellings():
    general = cli("help")
    assert general.returncode == 0
    for command in COMMANDS:
        assert re.search(rf"^  {re.escape(command)} ", general.stdout, re.M), command
        by_help = cli("help", command)
        by_flag = cli(command, "--help")
        assert by_help.returncode == by_flag.returncode == 0, command
        assert by_help.stdout == by_flag.stdout
        assert by_help.stdout.startswith("usage: kvtrim"), by_help.stdout[:80]
    compress = cli("help", "compress").stdout
    assert "--keep_fraction" in compress and "--target" in compress
    assert "--wait" not in compress  # health's flag only
    assert "--wait" in cli("help", "health").stdout
    moved = cli("profile")  # LU-KV profiling is a program of its own
    assert moved.returncode == 2 and "kvtrim-lukv-profile" in moved.stderr, moved.stderr
    unknown = cli("help", "compres")
    assert unknown.returncode == 2
    assert 'unknown command "compres"' in unknown.stderr


def test_every_command_answers_one_json_object(server, layers):
    target = f"--target={server.address}"
    health = json_of(cli(target, "--json", "health"))
    assert health["service"] == "kvtrim.v1.Kvtrim" and health["status"] == "SERVING"
    policies = json_of(cli(target, "--json", "policies"))
    assert "dropkv" in [p["name"] for p in policies["policies"]]
    digest = json_of(cli(target, "--json", "register-model", f"--model={BUNDLE}"))["digest"]
    assert digest.startswith("sha256:")
    models = json_of(cli(target, "--json", "models"))
    assert digest in [m["digest"] for m in models["models"]]

    answer = json_of(cli(target, "--json", "compress", "--policy=dropkv", "--keep_fraction=0.2",
                         f"--input={SAMPLE}", "--show_indices"))
    assert answer["rpc"] == "Compress" and answer["backend"] == "cpu"
    assert [layer["layer_id"] for layer in answer["layers"]] == list(range(5))
    kept = sum(sum(layer["kept"]) for layer in answer["layers"])
    assert answer["totals"]["tokens_kept"] == answer["summary"]["kept"] == kept
    # The kept lists equal the Python client's for the same request.
    with kvtrim.Client(server.address) as client:
        reference = client.compress(policy="dropkv", keep=0.2, num_layers=5,
                                    layers=[kvtrim.Layer(k, v, q, layer_id=i)
                                            for i, (k, v, q) in enumerate(layers)])
    for layer, expected in zip(answer["layers"], reference.layers):
        assert layer["kept_indices"] == [k.tolist() for k in expected.kept]
        assert len(layer["perturbation"]) == len(layer["kept"])

    summary = json_of(cli(target, "--json", "compress", "--policy=snapkv", "--keep_fraction=0.2",
                          f"--input={SAMPLE}", "--session", "--summary"))
    assert set(summary) == {"policy", "budget", "kept", "cached", "kept_ratio",
                            "mean_perturbation", "compute_seconds"}
    assert summary["policy"] == "snapkv" and 0 < summary["kept_ratio"] <= 0.25

    assert json_of(cli(target, "--json", "delete-model", digest)) == {"deleted": digest}


def test_errors_are_json_on_stderr_with_the_usual_exit_codes(server):
    target = f"--target={server.address}"
    rpc = cli(target, "--json", "compress", "--policy=no_such_policy", "--keep_fraction=0.2",
              f"--input={SAMPLE}")
    assert rpc.returncode == 1 and rpc.stdout == ""
    error = json.loads(rpc.stderr)["error"]
    assert error["kind"] == "rpc" and error["rpc"] == "Compress"
    assert error["code"] == "INVALID_ARGUMENT" and "no_such_policy" in error["message"]
    usage = cli(target, "--json", "compress", "--policy=dropkv", f"--input={SAMPLE}")
    assert usage.returncode == 2
    assert json.loads(usage.stderr)["error"]["kind"] == "usage"
    missing = cli(target, "--json", "delete-model", "sha256:" + "0" * 64)
    assert missing.returncode == 1
    assert json.loads(missing.stderr)["error"]["code"] == "NOT_FOUND"


def test_regions_lists_a_workers_lease_until_it_ends(server):
    """`kvtrim regions --client_id=` shows what a worker registered (the Python client's shared
    array: one host shm segment); once the worker's lease ends, NOT_FOUND (exit 1)."""
    target = f"--target={server.address}"
    with kvtrim.Client(server.address) as client:
        array = client.shared_array((4, 256), np.float32)
        lease_id = client.lease().client_id
        mine = client.list_regions()
        assert [(r.kind, r.size_bytes) for r in mine.regions] == [("host_shm", array.nbytes)]
        listed = json_of(cli(target, "--json", "regions", f"--client_id={lease_id}"))
        assert listed["enabled"] is True and int(listed["leases"]) >= 1
        assert [r["region_id"] for r in listed["regions"]] == [mine.regions[0].region_id]
        text = cli(target, "regions", f"--client_id={lease_id}")
        assert text.returncode == 0 and "this lease: 1 regions" in text.stdout, text.stdout
        totals = json_of(cli(target, "--json", "regions"))
        assert totals["regions"] == [] and int(totals["regions_by_kind"]["host_shm"]) >= 1
    deadline = time.monotonic() + 10  # the lease ends on the server's side asynchronously
    while True:
        gone = cli(target, "--json", "regions", f"--client_id={lease_id}")
        if gone.returncode != 0 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert gone.returncode == 1, gone.stdout
    assert json.loads(gone.stderr)["error"]["code"] == "NOT_FOUND"
    usage = cli(target, "models", f"--client_id={lease_id}")
    assert usage.returncode == 2 and "--client_id is a flag of regions" in usage.stderr


def test_health_wait_returns_once_a_late_kvtrimd_serves(tmp_path):
    socket = tmp_path / "kvtrimd.sock"
    started = time.monotonic()
    waiting = subprocess.Popen([str(KVTRIM_CLI), f"--target=unix:{socket}", "--json", "health",
                                "--wait=60"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    time.sleep(3.0)  # the CLI is now retrying a socket nobody listens on
    assert waiting.poll() is None
    server = Server(tmp_path, f"--listen=unix:{socket}")
    try:
        serving_at = time.monotonic()
        out, err = waiting.communicate(timeout=60)
        done_at = time.monotonic()
    finally:
        server.stop()
    assert waiting.returncode == 0, err
    answer = json.loads(out)
    assert answer["status"] == "SERVING" and answer["checks"] >= 2
    assert answer["waited_seconds"] >= 3.0
    # Noticed soon after the port file: a check every 100 ms, each on a fresh connection
    # (one channel kept would wait out gRPC's reconnect backoff, 2.6 s and more by now).
    assert done_at - serving_at < 2.5, (started, serving_at, done_at)


def test_health_wait_gives_up_after_its_seconds(tmp_path):
    started = time.monotonic()
    gone = cli(f"--target=unix:{tmp_path / 'nobody.sock'}", "health", "--wait=0.5")
    elapsed = time.monotonic() - started
    assert gone.returncode == 1
    assert "UNAVAILABLE" in gone.stderr
    assert 0.5 <= elapsed < 10, elapsed
    assert cli(f"--target=unix:{tmp_path / 'x'}", "policies", "--wait=1").returncode == 2
