"""The alerting rules' runbooks: every alert of deploy/prometheus/kvtrim-rules.yaml links a
section of docs/runbooks.md that exists, and tools/prometheus_rules.py --runbook_base turns
those links into absolute URLs."""

import pathlib
import re
import subprocess
import sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import prometheus_rules  # noqa: E402

RULES = ROOT / "deploy/prometheus/kvtrim-rules.yaml"


def spec():
    return prometheus_rules.rule_file(yaml.safe_load(RULES.read_text()))


def runbook_anchors():
    """GitHub's anchors of docs/runbooks.md's second-level headings."""
    headings = re.findall(r"^## (.+)$", (ROOT / "docs/runbooks.md").read_text(), re.M)
    return {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-") for h in headings}


def test_every_alert_links_its_own_runbook_section():
    anchors = runbook_anchors()
    alerts = prometheus_rules.alerts(spec())
    assert len(alerts) >= 9
    for rule in alerts:
        url = rule["annotations"].get("runbook_url")
        assert url == f"docs/runbooks.md#{rule['alert'].lower()}", (rule["alert"], url)
        assert url.split("#")[1] in anchors, (rule["alert"], sorted(anchors))
    # No section without its alert either (a renamed alert leaves none behind).
    assert anchors == {rule["alert"].lower() for rule in alerts}


def test_runbook_base_makes_every_link_absolute(tmp_path):
    out = tmp_path / "kvtrim.rules.yml"
    subprocess.run([sys.executable, str(ROOT / "tools/prometheus_rules.py"),
                    "--runbook_base=https://docs.example.org/kvtrim/", str(RULES), str(out)],
                   check=True)
    written = prometheus_rules.alerts(yaml.safe_load(out.read_text()))
    assert written and all(
        rule["annotations"]["runbook_url"] ==
        f"https://docs.example.org/kvtrim/docs/runbooks.md#{rule['alert'].lower()}"
        for rule in written)
    # Without the flag the links stay as written.
    subprocess.run([sys.executable, str(ROOT / "tools/prometheus_rules.py"), str(RULES), str(out)],
                   check=True)
    assert all(rule["annotations"]["runbook_url"].startswith("docs/runbooks.md#")
               for rule in prometheus_rules.alerts(yaml.safe_load(out.read_text())))
