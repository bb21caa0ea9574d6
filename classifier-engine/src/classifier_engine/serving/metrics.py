"""``GET /metrics``: the requests a server answered and how long they took, in Prometheus's text format.

Kept by the gate (``gate.py``), which sees every ``POST /predict`` and its status; the server runs one API
process (``server.py``), so these are the whole server's figures.
"""

from __future__ import annotations

import bisect
from collections import Counter

# Seconds: an image on a CPU takes milliseconds to a second; the last bucket is everything.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def sample(name: str, label: str, value: object, count: object) -> str:
    """One line of the format: ``name{label="value"} count``."""
    return name + "{" + f'{label}="{value}"' + "} " + str(count)


class RequestFigures:
    """Counts by status and a latency histogram of the answered requests."""

    def __init__(self) -> None:
        self.by_status: Counter[int] = Counter()
        self.in_bucket = [0] * (len(BUCKETS) + 1)
        self.seconds = 0.0

    def add(self, status: int, seconds: float) -> None:
        self.by_status[status] += 1
        self.in_bucket[bisect.bisect_left(BUCKETS, seconds)] += 1
        self.seconds += seconds

    def text(self, waiting: int) -> str:
        lines = [
            "# HELP classifier_requests_total Requests to /predict answered, by HTTP status.",
            "# TYPE classifier_requests_total counter",
            *(sample("classifier_requests_total", "status", s, n) for s, n in sorted(self.by_status.items())),
            "# HELP classifier_request_seconds Time from a request's arrival to its answer.",
            "# TYPE classifier_request_seconds histogram",
        ]
        total = 0
        for bound, count in zip((*BUCKETS, "+Inf"), self.in_bucket, strict=True):
            total += count
            lines.append(sample("classifier_request_seconds_bucket", "le", bound, total))
        lines += [
            f"classifier_request_seconds_sum {self.seconds:.6f}",
            f"classifier_request_seconds_count {total}",
            "# HELP classifier_requests_waiting Requests held now, between the gate and their answer.",
            "# TYPE classifier_requests_waiting gauge",
            f"classifier_requests_waiting {waiting}",
        ]
        return "\n".join(lines) + "\n"
