"""GET /metrics of a cluster node: what GET /cluster says of each peer, as gauges."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from server.replication.node import Node


class ClusterCollector(Collector):
    """Reads Node.status() at each scrape."""

    def __init__(self, node: Node) -> None:
        self.node = node

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        status = self.node.status()
        reachable = GaugeMetricFamily(
            "strata_peer_reachable", "1 if the peer answered its last request.", labels=["peer"]
        )
        behind = GaugeMetricFamily(
            "strata_peer_runs_behind",
            "Runs one side committed that the other has not taken yet, as last seen: "
            "direction=here (this node lacks them) or direction=peer.",
            labels=["peer", "direction"],
        )
        since = GaugeMetricFamily(
            "strata_peer_behind_seconds",
            "Seconds this node has lacked some of the peer's runs (0: none).",
            labels=["peer"],
        )
        for peer in status["peers"]:  # type: ignore[attr-defined]
            label = str(peer["name"] or peer["url"])
            reachable.add_metric([label], 1.0 if peer["reachable"] else 0.0)
            for direction, key in (("here", "runs_behind_peer"), ("peer", "peer_runs_behind")):
                if peer[key] is not None:
                    behind.add_metric([label, direction], float(peer[key]))
            since.add_metric([label], float(peer["behind_since_seconds"] or 0.0))
        runs = GaugeMetricFamily("strata_cluster_runs", "Runs this node has committed.")
        runs.add_metric([], float(status["runs"]))  # type: ignore[arg-type]
        yield from (reachable, behind, since, runs)
