"""The soak test's tallies inside one worker process: requests, latencies, answers and
errors per transport and policy, deliberately bad requests per case. Thread-safe."""

from __future__ import annotations

import re
import threading
import time
from collections import defaultdict
from typing import Optional

MAX_MESSAGES = 30
_NUMBERS = re.compile(r"\d+")


def signature(transport: str, code: str, message: str) -> str:
    """An error's kind: its code and message with numbers as N and the plan cut off (the
    transport's family, unary or session, kept)."""
    family = "session" if "session" in transport else transport.split("_")[0]
    text = _NUMBERS.sub("N", message.split(" [plan ")[0])[:160]
    return f"{family} {code}: {text}"


def _transport_entry() -> dict:
    """Empty tallies of one transport."""
    return {"requests": 0, "ok": 0, "layers": 0, "unexpected": 0, "latency_s": []}


def _count_entry() -> dict:
    """Empty tallies of one policy."""
    return {"requests": 0, "ok": 0, "unexpected": 0}


def _case_entry(code: str, fragment: str) -> dict:
    """Empty tallies of one deliberately bad request."""
    return {"expected_code": code, "fragment": fragment, "runs": 0, "matched": 0,
            "wrong": 0}


class Recorder:
    """Tallies of one worker process (shared by its client threads)."""

    def __init__(self, started: float):
        """Empty tallies; `started` is the run's start (epoch seconds) for message times."""
        self.started = started
        self._lock = threading.Lock()
        self.transports = defaultdict(_transport_entry)
        self.policies = defaultdict(_count_entry)
        self.matrix = defaultdict(int)           # "transport|policy" -> requests
        self.cases: dict = {}
        self.unexpected_by = defaultdict(int)    # "transport|code" -> count
        self.signatures = defaultdict(int)       # signature() -> count
        self.messages: list = []
        self.unexpected_total = 0
        self.loadgen_runs: list = []
        self.events = defaultdict(int)           # churns, cut loadgen runs, ...

    def ok(self, transport: str, policy: str, latency: float, layers: int) -> None:
        """A request answered as expected."""
        with self._lock:
            entry = self.transports[transport]
            entry["requests"] += 1
            entry["ok"] += 1
            entry["layers"] += layers
            entry["latency_s"].append(round(latency, 6))
            self.policies[policy]["requests"] += 1
            self.policies[policy]["ok"] += 1
            self.matrix[f"{transport}|{policy}"] += 1

    def unexpected(self, transport: str, policy: str, code: str, message: str,
                   case: Optional[str] = None) -> None:
        """An error nobody provoked, a wrong code for a provoked one, or a bad answer."""
        with self._lock:
            self.unexpected_total += 1
            if case is None:
                self.transports[transport]["requests"] += 1
                self.transports[transport]["unexpected"] += 1
                self.policies[policy]["requests"] += 1
                self.policies[policy]["unexpected"] += 1
                self.matrix[f"{transport}|{policy}"] += 1
            self.unexpected_by[f"{transport}|{code}"] += 1
            self.signatures[signature(transport, code, message)] += 1
            if len(self.messages) < MAX_MESSAGES:
                self.messages.append({"t_s": round(time.time() - self.started, 1),
                                      "transport": transport, "policy": policy,
                                      "case": case, "code": code, "message": message[:600]})

    def case(self, name: str, code: str, fragment: str, got_code: str, got_message: str,
             transport: str) -> None:
        """One deliberately bad request and the status it got."""
        with self._lock:
            entry = self.cases.setdefault(name, _case_entry(code, fragment))
            entry["runs"] += 1
            matched = got_code == code and fragment in got_message
            entry["matched" if matched else "wrong"] += 1
        if not matched:
            self.unexpected(transport, name, got_code,
                            f"expected {code} '{fragment}', got {got_code}: {got_message}",
                            case=name)

    def loadgen_run(self, run: dict) -> None:
        """One successful kvtrim-loadgen run: `sessions` requests of `layers` layers in all,
        its latency summary kept as is (the load generator reports percentiles, not
        samples)."""
        with self._lock:
            self.loadgen_runs.append(run)
            entry = self.transports[run["transport"]]
            entry["requests"] += run["sessions"]
            entry["ok"] += run["sessions"]
            entry["layers"] += run["layers"]
            self.policies[run["policy"]]["requests"] += run["sessions"]
            self.policies[run["policy"]]["ok"] += run["sessions"]
            self.matrix[f"{run['transport']}|{run['policy']}"] += run["sessions"]

    def event(self, name: str, count: int = 1) -> None:
        """Counts something that happened (a client re-connected, a run cut at the end)."""
        with self._lock:
            self.events[name] += count

    def requests(self) -> int:
        """Requests so far (answered or failed, bad ones included)."""
        with self._lock:
            return (sum(e["requests"] for e in self.transports.values())
                    + sum(c["runs"] for c in self.cases.values()))

    def to_json(self) -> dict:
        """Everything, for the parent to merge."""
        with self._lock:
            return {"transports": dict(self.transports), "policies": dict(self.policies),
                    "matrix": dict(self.matrix), "cases": dict(self.cases),
                    "unexpected_by": dict(self.unexpected_by),
                    "signatures": dict(self.signatures), "messages": list(self.messages),
                    "unexpected_total": self.unexpected_total,
                    "loadgen_runs": list(self.loadgen_runs), "events": dict(self.events)}
