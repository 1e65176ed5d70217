"""``/metrics`` in the Prometheus text format, collected at scrape time (no background work)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from cachemgr.counters import CounterBook
from cachemgr.daemon.usage import UsageIndex

#: ``(name, help, labels, value)`` of one gauge sample: the daemon's degraded states.
Gauge = tuple[str, str, dict[str, str], float]


class _Collector:
    def __init__(
        self,
        counters: CounterBook,
        index: Callable[[], UsageIndex],
        limit_bytes: Callable[[], int | None],
        queue_depth: Callable[[], int],
        gauges: Callable[[], Sequence[Gauge]] = lambda: (),
    ) -> None:
        self.counters = counters
        self.index = index
        self.limit_bytes = limit_bytes
        self.queue_depth = queue_depth
        self.gauges = gauges

    def collect(self) -> Iterator[Metric]:
        for name, value in sorted(self.counters.snapshot().items()):
            yield CounterMetricFamily(
                f"cachemgr_{name}", f"cachemgr {name} since first start", value=value
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
        families: dict[str, GaugeMetricFamily] = {}
        for name, text, labels, value in self.gauges():
            family = families.get(name)
            if family is None:
                family = families[name] = GaugeMetricFamily(name, text, labels=sorted(labels))
            family.add_metric([labels[k] for k in sorted(labels)], value)
        yield from families.values()


class Metrics:
    """A private registry exposing the daemon's counters, usage and queue depth."""

    def __init__(
        self,
        counters: CounterBook,
        index: Callable[[], UsageIndex],
        limit_bytes: Callable[[], int | None],
        queue_depth: Callable[[], int],
        gauges: Callable[[], Sequence[Gauge]] = lambda: (),
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        collector = _Collector(counters, index, limit_bytes, queue_depth, gauges)
        self.registry.register(collector)  # type: ignore[arg-type]

    def render(self) -> bytes:
        """The text exposition of every metric."""
        return generate_latest(self.registry)
