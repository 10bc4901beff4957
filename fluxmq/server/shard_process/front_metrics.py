"""The metrics port of a node with several shard processes, served by its front end.

Each shard process keeps its own metrics (its queues, its shard, its process); a scrape of the
front end's /metrics asks every shard process for its exposition over its channel, at once,
and serves them together, each series labelled with the shard process it came from
(``shard_process="1"``). ``fluxmq_shard_process_up`` says which ones answered: one that is
restarting, or does not answer within the timeout, is left out of that scrape, not waited for.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Sequence

from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from fluxmq.server.shard_process.front import ShardProcessLink

log = logging.getLogger(__name__)

PROCESS_LABEL = "shard_process"
SCRAPE_TIMEOUT_S = 5.0


def merged_families(texts: Sequence[bytes]) -> Iterator[Metric]:
    """The families of every shard process's exposition (``texts[i]`` from shard process i),
    merged by name, each sample labelled with its shard process.

    >>> text = b"# TYPE fluxmq_x counter\\nfluxmq_x_total 3.0\\n"
    >>> [(s.labels, s.value) for f in merged_families([text, text]) for s in f.samples]
    [({'shard_process': '0'}, 3.0), ({'shard_process': '1'}, 3.0)]
    """
    families: dict[str, Metric] = {}
    for index, text in enumerate(texts):
        for family in text_string_to_metric_families(text.decode("utf-8")):
            merged = families.get(family.name)
            if merged is None:
                merged = Metric(family.name, family.documentation, family.type, family.unit)
                families[family.name] = merged
            for sample in family.samples:
                labels = {**sample.labels, PROCESS_LABEL: str(index)}
                merged.samples.append(sample._replace(labels=labels))
    return iter(families.values())


class ShardProcessMetrics(Collector):  # type: ignore[misc]
    """Collected on the HTTP thread; the asks run on the front end's event loop."""

    def __init__(
        self,
        links: Sequence[ShardProcessLink],
        loop: asyncio.AbstractEventLoop,
        timeout_s: float = SCRAPE_TIMEOUT_S,
    ) -> None:
        self._links = tuple(links)
        self._loop = loop
        self._timeout_s = timeout_s

    async def _ask_all(self) -> list[bytes]:
        return list(await asyncio.gather(*(link.metrics(self._timeout_s) for link in self._links)))

    def collect(self) -> Iterator[Metric]:
        asked = asyncio.run_coroutine_threadsafe(self._ask_all(), self._loop)
        texts = asked.result(self._timeout_s + 1)
        up = GaugeMetricFamily(
            "fluxmq_shard_process_up",
            "1 if the shard process answered this scrape (its series are in it), else 0",
            labels=[PROCESS_LABEL],
        )
        for index, text in enumerate(texts):
            up.add_metric([str(index)], 1.0 if text else 0.0)
        yield up
        try:
            yield from merged_families(texts)
        except ValueError:  # a damaged exposition: said here, the scrape still answers
            log.exception("a shard process's metrics did not parse")
