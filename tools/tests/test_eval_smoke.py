"""tools/eval/evaluate.py end to end against this build's kvtrimd (CPU backend, inline
transport): masks of a keep-everything answer reproduce the full cache exactly, and an
error-targeted budget keeps less and reports a perturbation within its epsilon.
Needs torch (skipped without it, as in CI)."""

import argparse
import os
import pathlib
import sys

import pytest

torch = pytest.importorskip("torch")

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "eval"))
sys.path.insert(1, str(ROOT / "tools"))

import evaluate  # noqa: E402
import soak_server  # noqa: E402
import tasks  # noqa: E402
from gqa import GqaConfig, GqaDecoder  # noqa: E402

import kvtrim  # noqa: E402

BUILD = pathlib.Path(os.environ.get("KVTRIM_BUILD_DIR", ROOT / "build"))
KVTRIMD = BUILD / "service" / "kvtrimd"


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    if not KVTRIMD.exists():
        pytest.skip(f"{KVTRIMD} not built")
    process, paths = soak_server.start_kvtrimd(str(KVTRIMD), str(tmp_path_factory.mktemp("d")),
                                               [], {})
    address = soak_server.wait_ready(process, paths["port_file"], 60)["grpc"]
    with kvtrim.Client(address) as c:
        yield c
    soak_server.stop_kvtrimd(process, paths["port_file"], 30)


def lm_args(**overrides):
    base = dict(samples=1, window=32, prompt=128, continuation=33)
    base.update(overrides)
    return argparse.Namespace(**base)


def test_keep_everything_is_the_full_cache(client):
    model = GqaDecoder.load(str(ROOT / "models" / "kjv-byte-lm"))
    budgets = evaluate.Budgets(["snapkv", "dropkv"], [1.0], [], [])
    with torch.no_grad():
        out = evaluate.run_lm(lm_args(), model, client, None, budgets, torch.device("cpu"))
    for row in out["rows"]:
        assert row["kept_fraction"] == 1.0
        assert row["nll"] == pytest.approx(out["full_cache_nll"], abs=1e-6)


def test_error_targeted_budget_keeps_less_within_epsilon(client):
    model = GqaDecoder.load(str(ROOT / "models" / "kjv-byte-lm"))
    budgets = evaluate.Budgets([], [], [0.05], ["dropkv"])
    with torch.no_grad():
        out = evaluate.run_lm(lm_args(), model, client, None, budgets, torch.device("cpu"))
    (row,) = out["rows"]
    assert row["kind"] == "max_perturbation"
    assert 0.0 < row["kept_fraction"] < 1.0
    assert row["perturbation"] <= 0.05


def test_retrieval_run_reports_every_point(client):
    torch.manual_seed(0)
    model = GqaDecoder(GqaConfig(vocab_size=tasks.VOCAB, hidden_size=64, num_layers=2,
                                 num_heads=4, num_kv_heads=2, intermediate_size=128)).eval()
    budgets = evaluate.Budgets(["snapkv"], [0.25], [0.1], ["dropkv"])
    args = argparse.Namespace(samples=2, window=32, lengths=[256], seed=3)
    with torch.no_grad():
        out = evaluate.run_retrieval(args, model, client, None, budgets, torch.device("cpu"))
    assert set(out["full_cache_accuracy"]) == {"kv_lookup@256", "needle@256"}
    assert len(out["rows"]) == 2 * 2
    for row in out["rows"]:
        assert 0.0 <= row["accuracy"] <= 1.0
        if row["kind"] == "fraction":
            assert row["kept_fraction"] == pytest.approx(0.25, abs=0.01)
