"""``/metrics`` in the Prometheus text format, collected at scrape time (no background work)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from cachemgr.compile.results import Status
from cachemgr.daemon.usage import UsageIndex
from cachemgr.storage.counters import CounterBook

#: ``(name, help, labels, value)`` of one gauge sample: the daemon's degraded states.
Gauge = tuple[str, str, dict[str, str], float]
#: Buckets (seconds) of the compile duration and of the hit latency histograms.
COMPILE_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
HIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)


def hit_rate(counters: Mapping[str, int]) -> float:
    """hits / (hits + misses), as ccache shows it; 0 before the first lookup."""
    lookups = counters.get("hits", 0) + counters.get("misses", 0)
    return counters.get("hits", 0) / lookups if lookups else 0.0


class _Collector:
    def __init__(
        self,
        counters: CounterBook,
        index: Callable[[], UsageIndex],
        limit_bytes: Callable[[], int | None],
        queue_depth: Callable[[], int],
        gauges: Callable[[], Sequence[Gauge]] = lambda: (),
        queue_figures: Callable[[], Mapping[str, int]] = dict,
        remotes: Callable[[], Mapping[str, Mapping[str, Any]]] = dict,
        upload_refused: Callable[[], int] = int,
    ) -> None:
        self.remotes = remotes
        self.upload_refused = upload_refused
        self.counters = counters
        self.index = index
        self.limit_bytes = limit_bytes
        self.queue_depth = queue_depth
        self.gauges = gauges
        self.queue_figures = queue_figures

    def collect(self) -> Iterator[Metric]:
        snapshot = self.counters.snapshot()
        for name, value in sorted(snapshot.items()):  # the names of ``stats`` (docs/commands.md)
            yield CounterMetricFamily(
                f"cachemgr_{name}", f"cachemgr {name} of this kernel cache", value=value
            )
        yield GaugeMetricFamily(
            "cachemgr_hit_rate", "hits / (hits + misses); 0 before any", value=hit_rate(snapshot)
        )
        figures = self.queue_figures()
        for name in ("queued", "running"):
            if name in figures:
                yield GaugeMetricFamily(
                    f"cachemgr_queue_{name}", f"compile jobs {name} now", value=figures[name]
                )
        if "waited" in figures:
            yield CounterMetricFamily(
                "cachemgr_queue_waited",
                "requests that joined a job already queued or running for their kernel",
                value=figures["waited"],
            )
        index = self.index()
        used = GaugeMetricFamily(
            "cachemgr_chip_used_bytes", "apparent bytes of regular files", labels=["soc_version"]
        )
        entries = GaugeMetricFamily(
            "cachemgr_chip_entries", "entries (main jsons)", labels=["soc_version"]
        )
        for soc in index.chips():
            used.add_metric([soc], index.used_bytes(soc))
            entries.add_metric([soc], index.entries(soc))
        yield used
        yield entries
        limit = self.limit_bytes()  # None: never evict (max_op_cache_size = -1)
        yield GaugeMetricFamily(
            "cachemgr_never_evict",
            "1: max_op_cache_size = -1, size eviction off",
            value=limit is None,
        )
        if limit is not None:
            yield GaugeMetricFamily(
                "cachemgr_chip_limit_bytes",
                "max_op_cache_size per chip folder in bytes",
                value=limit,
            )
        yield GaugeMetricFamily(
            "cachemgr_queue_jobs", "compile jobs queued or running", value=self.queue_depth()
        )
        yield from remote_metrics(self.remotes())
        yield CounterMetricFamily(
            "cachemgr_remote_upload_refused",
            "entries not uploaded: a file of them belongs to a user not in [remote] upload_writers",
            value=self.upload_refused(),
        )
        families: dict[str, GaugeMetricFamily] = {}
        for name, text, labels, gauge_value in self.gauges():
            family = families.get(name)
            if family is None:
                family = families[name] = GaugeMetricFamily(name, text, labels=sorted(labels))
            family.add_metric([labels[k] for k in sorted(labels)], gauge_value)
        yield from families.values()


#: Each remote's counters in ``stats`` (``remotes.<name>.<counter>``) and their help texts;
#: ``/metrics`` names them ``cachemgr_remote_<counter>{remote="<name>"}``.
REMOTE_COUNTERS = {
    "hits": "entries fetched from the remote and served",
    "misses": "lookups the remote answered without the entry",
    "errors": "requests that failed (down, slow past its timeout, an error answer)",
    "rejected": "entries the remote sent that failed verification",
    "bytes_in": "bytes of entries fetched",
    "bytes_out": "bytes of entries uploaded",
    "uploads": "entries uploaded",
    "present": "entries seen locally that the remote had already (not sent)",
    "oversized": "entries not uploaded for their size (over the cap, or refused: HTTP 413)",
}
#: The states a remote can be in (``stats``' ``state``).
REMOTE_STATES = ("ok", "failing", "disabled")


def remote_metrics(rows: Mapping[str, Mapping[str, Any]]) -> Iterator[Metric]:
    """Per remote: its counters and its state as a 0/1 gauge per state."""
    for counter, text in REMOTE_COUNTERS.items():
        family = CounterMetricFamily(f"cachemgr_remote_{counter}", text, labels=["remote"])
        for name, row in sorted(rows.items()):
            family.add_metric([name], float(row.get(counter, 0)))
        yield family
    by_reason = CounterMetricFamily(
        "cachemgr_remote_rejected_by_reason",
        "entries the remote sent that were rejected, by reason (unknown_key, bad_signature, "
        "unsigned, parts, corrupt, wrong_entry, too_large, entry)",
        labels=["remote", "reason"],
    )
    for name, row in sorted(rows.items()):
        for reason, count in sorted(dict(row.get("rejected_by_reason") or {}).items()):
            by_reason.add_metric([name, reason], float(count))
    yield by_reason
    state = GaugeMetricFamily(
        "cachemgr_remote_state", "1 for the state each remote is in", labels=["remote", "state"]
    )
    for name, row in sorted(rows.items()):
        for one in REMOTE_STATES:
            state.add_metric([name, one], 1.0 if row.get("state") == one else 0.0)
    yield state


class Metrics:
    """A private registry exposing the daemon's counters, usage and queue depth."""

    def __init__(
        self,
        counters: CounterBook,
        index: Callable[[], UsageIndex],
        limit_bytes: Callable[[], int | None],
        queue_depth: Callable[[], int],
        gauges: Callable[[], Sequence[Gauge]] = lambda: (),
        queue_figures: Callable[[], Mapping[str, int]] = dict,
        remotes: Callable[[], Mapping[str, Mapping[str, Any]]] = dict,
        upload_refused: Callable[[], int] = int,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        collector = _Collector(
            counters, index, limit_bytes, queue_depth, gauges, queue_figures, remotes,
            upload_refused,
        )  # fmt: skip
        self.registry.register(collector)
        self.compile_seconds = Histogram(
            "cachemgr_compile_seconds",
            "seconds from submit to answer of requests answered compiled",
            buckets=COMPILE_BUCKETS,
            registry=self.registry,
        )
        self.hit_seconds = Histogram(
            "cachemgr_hit_seconds",
            "seconds from submit to answer of requests answered from the cache (hits)",
            buckets=HIT_BUCKETS,
            registry=self.registry,
        )

    def observe(self, status: str, seconds: float, coalesced: bool = False) -> None:
        """One answered compile request: a ``compiled`` one's duration, a hit's latency
        (a request answered by another daemon's compile is neither)."""
        if coalesced:
            return
        if status == Status.COMPILED:
            self.compile_seconds.observe(seconds)
        elif status == Status.HIT:
            self.hit_seconds.observe(seconds)

    def render(self) -> bytes:
        """The text exposition of every metric."""
        return generate_latest(self.registry)
