"""tools/soak_report.py's RSS analysis: the goal compares the medians of the first and last
quarter of the load after the warm-up, so one sample's spike does not decide it but a
steady rise does."""

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import soak_report  # noqa: E402


def _samples(rss_mib_at):
    """Load samples every 2 s over 0..600 s with RSS rss_mib_at(t) MiB, then one idle one."""
    out = [{"t_s": float(t), "phase": "load", "rss_kib": int(rss_mib_at(t) * 1024),
            "rss_anon_kib": 0, "hwm_kib": 0} for t in range(0, 601, 2)]
    out.append({"t_s": 605.0, "phase": "idle", "rss_kib": 1024, "rss_anon_kib": 0,
                "hwm_kib": 0})
    return out


def test_a_flat_plateau_meets_the_goal_despite_a_spike_at_the_end():
    rss = soak_report.rss_analysis(
        _samples(lambda t: 100 + (t / 3 if t < 180 else 60) + (40 if t == 600 else 0)),
        warmup_s=180, load_end_s=600)
    assert rss["warmup_end_t_s"] == 180
    assert rss["goal_window_s"] == 105
    assert rss["goal_growth_pct"] == 0
    assert rss["growth_pct"] == 25  # the single-sample figure sees the spike
    assert rss["windows_mib"]["rss"] == [160.0, 160.0]
    assert "heap_in_use" not in rss["windows_mib"]  # not sampled


def test_the_memory_figures_show_what_grew():
    samples = _samples(lambda t: 100 + t / 10)
    for s in samples:
        s["heap_in_use_kib"] = int((20 + s["t_s"] / 10) * 1024)
        s["heap_free_kib"] = 5 * 1024
    rss = soak_report.rss_analysis(samples, warmup_s=180, load_end_s=600)
    first, last = rss["windows_mib"]["heap_in_use"]
    assert last - first > 25  # the growth is in use, not free
    assert rss["windows_mib"]["heap_free"] == [5.0, 5.0]


def test_a_steady_rise_fails_the_goal():
    rss = soak_report.rss_analysis(_samples(lambda t: 100 + t / 10), warmup_s=180,
                                   load_end_s=600)
    # Medians of 180..285 s (~123 MiB) and 495..600 s (~155 MiB).
    assert rss["goal_growth_pct"] > 5
    assert rss["trend_mib_per_min"] == 6.0


def test_no_samples_after_the_warm_up_is_an_error():
    rss = soak_report.rss_analysis(_samples(lambda t: 100), warmup_s=900, load_end_s=600)
    assert "error" in rss
