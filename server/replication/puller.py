"""The background threads of a cluster node: a ``Puller`` per peer takes the runs the peer
committed that this node lacks, a ``DdlFollower`` applies the owner's DDL as it comes, and
a ``Settler`` gives the runs in conflict the rows the cluster chose.

A puller keeps, in this node's catalog, a cursor per peer incarnation: the position in
the peer's commit log up to which this node holds (or has refused for good) every run.
It asks for the runs after it, skips those it knows by run id, fetches the rest's rows and
submits them like any other run (spooled durably and recorded, then computed and
committed by the ingest pipeline), and moves the cursor on. A node wiped and started
again is a new incarnation with cursors of none, so it takes everything from every peer;
a peer wiped is a new incarnation too, whose log is read from its start. A run whose
stream has not reached this node yet stops the pass there: the cursor stays before it.
"""

from __future__ import annotations

import sqlalchemy as sa

from server.errors import ReplicaObsolete, ReplicaTooEarly, Unavailable
from server.replication import state
from server.replication.node import Node
from server.replication.peers import Peer, PeerRefused, PeerUnreachable
from server.workers.loop import Background

# Runs asked for per request to a peer's log.
PAGE = 500


class Puller(Background):
    name = "replicator"

    def __init__(self, node: Node, peer: Peer, interval: float) -> None:
        self.node = node
        self.peer = peer
        self.interval = interval
        super().__init__()

    def _loop(self) -> None:
        quiet = False  # an unreachable peer is logged once, until it answers again
        while not self._stopping.is_set():
            try:
                taken = self.pull_once()
                quiet = False
            except PeerUnreachable as lost:
                if not quiet:
                    self.log.warning("peer %s unreachable: %s", self.peer.url, lost)
                quiet, taken = True, 0
            except sa.exc.OperationalError as error:
                self.log.warning("pull from %s: %s", self.peer.url, str(error.orig).strip())
                taken = 0
            except Exception:
                self.log.exception("pull from %s failed; retrying", self.peer.url)
                taken = 0
            if not taken:
                self._stopping.wait(self.interval)

    def pull_once(self) -> int:
        """One page of the peer's log; how many of its runs were handled."""
        node, peer = self.node, self.peer
        if peer.incarnation is None:
            peer.hello(node.name, node.incarnation)
        assert peer.name is not None and peer.incarnation is not None
        incarnation = peer.incarnation
        with node.engine.connect() as connection:
            cursor = state.cursor(connection, peer.name, incarnation)
        answer = peer.log(cursor, PAGE, node.name, node.incarnation)
        if peer.incarnation != incarnation:
            return 1  # wiped and started again meanwhile: read it from its start
        runs = answer["runs"]
        assert isinstance(runs, list)
        if not runs:
            return 0
        with node.engine.connect() as connection:
            known = state.known_runs(connection, [str(r["run_id"]) for r in runs])
        done = cursor
        for run in runs:
            run_id = str(run["run_id"])
            if run_id in known:
                self.node.compare(run_id, peer.name, known[run_id], run.get("digest"))
            elif not self._take(run):
                break
            done = int(run["pos"])
            if self._stopping.is_set():
                break
        if done > cursor:
            with node.engine.begin() as connection:
                state.save_cursor(connection, peer.name, incarnation, done)
        return len(runs) if done > cursor else 0

    def _take(self, run: dict[str, object]) -> bool:
        """Fetch and submit one run the peer has; False if it must wait (its stream has
        not reached this node)."""
        run_id, stream = str(run["run_id"]), str(run["stream"])
        origin = None if run.get("origin") is None else int(str(run["origin"]))
        try:
            table = self.peer.rows(run_id)
        except PeerRefused as refused:
            if refused.status == 404:  # dropped there since: nothing to take
                return True
            raise
        try:
            self.node.accept_replica(stream, run_id, origin, table)
        except ReplicaObsolete as obsolete:
            self.log.info("run %s of %s not taken: %s", run_id, self.peer.url, obsolete)
        except ReplicaTooEarly:
            return False
        return True


class _Rounds(Background):
    """A node's background work done in rounds, every ``interval`` seconds (``one_round``);
    a round that fails is logged and the next one tries again."""

    what = "a round"  # for the log

    def __init__(self, node: Node, interval: float) -> None:
        self.node = node
        self.interval = interval
        super().__init__()

    def one_round(self) -> None:
        raise NotImplementedError

    def _loop(self) -> None:
        while not self._stopping.wait(self.interval):
            try:
                self.one_round()
            except Unavailable:
                pass  # a peer is out of reach: the next round tries again
            except sa.exc.OperationalError as error:
                self.log.warning("%s: %s", self.what, str(error.orig).strip())
            except Exception:
                self.log.exception("%s failed; retrying", self.what)


class DdlFollower(_Rounds):
    """Applies the DDL owner's log on a node that is not the owner; on the owner, takes
    the log back from the peers if it started without one (Node.recover_ddl)."""

    name = "ddl-follower"
    what = "applying the owner's DDL"

    def one_round(self) -> None:
        if self.node.is_owner:
            self.node.recover_ddl()
        else:
            self.node.catch_up_ddl()


class Settler(_Rounds):
    """Replaces the rows of the runs in conflict this node holds other than the cluster's
    choice (Node.settle_conflicts)."""

    name = "conflict-settler"
    what = "settling conflicts"

    def one_round(self) -> None:
        self.node.settle_conflicts()
