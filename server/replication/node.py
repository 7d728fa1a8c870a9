"""One node of a cluster: its DDL goes through the owner's one order, its runs are copied to
as many nodes as STRATA_MIN_COPIES asks before they are acknowledged, and its peers' copies
of runs are taken in like any other run (seeds/003: "treated like any other run").

DDL. The owner (STRATA_DDL_OWNER) applies a statement and appends it to its DDL log in one
transaction; any other node forwards the statement to the owner, then applies the log up
to it before answering (read-your-DDL), and a follower (``DdlFollower``) applies the rest
as it comes. Each applied entry records its position in the same transaction as its
effect, so a crash never applies one twice. A stream's origin is the position of the
CREATE that made it: a run carries its stream's origin, so that the runs of a stream
dropped and created again under the same name never mix.

Runs. A node's views depend only on the set of runs it holds (invariant 7). ``Puller``
threads take every run a peer committed, in the peer's commit order, and submit those this
node lacks; a run id is committed at most once per node (the runs table's unique run id),
so runs reach a node from several peers, in any order, exactly once.
"""

from __future__ import annotations

import logging
import threading
import time

import pyarrow as pa
import sqlalchemy as sa

from rewriter.errors import InvalidSQL, StrataError
from rewriter.naming import made_with as naming_made_with
from rewriter.naming import raw_archive_table
from rewriter.plan import RawStreamPlan
from server import catalog
from server.catalog import RunRecord, StreamRecord
from server.errors import (
    NotTheOwner,
    ReplicaObsolete,
    ReplicaTooEarly,
    StreamExists,
    StreamInUse,
    Unavailable,
    UnknownRun,
    UnknownStream,
)
from server.ingest.archive import copy_out
from server.ingest.parse import arrow_schema
from server.replication import state
from server.replication.digest import digest
from server.replication.peers import Peer, PeerRefused, PeerUnreachable
from server.replication.replace import Unreplaceable, replace_rows
from server.service import StrataService, Within
from server.settings import Settings

log = logging.getLogger("strata.cluster")

# What a refusal the owner sent back is, here: the same error the owner raised.
_REFUSALS: dict[int, type[StrataError]] = {
    400: InvalidSQL,
    404: UnknownStream,
    421: NotTheOwner,
}


class Node:
    """This node of a cluster (server/replication/__init__.py)."""

    def __init__(self, settings: Settings, service: StrataService, token: str | None) -> None:
        self.settings = settings
        self.service = service
        self.engine = service.engine
        self.name = settings.node or "strata"
        self.owner = settings.ddl_owner or self.name
        self.min_copies = settings.min_copies
        self.peers = [Peer(url, token, settings.peer_timeout) for url in settings.peers]
        self._ddl_lock = threading.Lock()  # one statement applied at a time
        # Runs in conflict whose rows this node cannot replace, and why (replace.py).
        self.unreplaceable: dict[str, str] = {}
        # The owner orders new DDL only once it holds the cluster's log (see recover_ddl).
        self._log_held = not self.is_owner
        with self.engine.connect() as connection:
            self.incarnation = state.incarnation(connection)

    @property
    def is_owner(self) -> bool:
        return self.owner == self.name

    def close(self) -> None:
        for peer in self.peers:
            peer.close()

    # ---- DDL -------------------------------------------------------------------------

    def create_stream(self, text: str) -> StreamRecord:
        if self.is_owner:
            self.recover_ddl()
            with self._ddl_lock:
                return self.service.apply_create(text, self._logged("create", text))
        answer = self._forward("create", text)
        self.catch_up_ddl(until=int(str(answer["pos"])))
        return self.service.stream(str(answer["stream"]))

    def alter_stream(self, text: str) -> dict[str, object]:
        if self.is_owner:
            self.recover_ddl()
            with self._ddl_lock:
                return self.service.apply_alter(text, self._logged("alter", text))
        answer = self._forward("alter", text)
        self.catch_up_ddl(until=int(str(answer["pos"])))
        altered = answer["altered"]
        assert isinstance(altered, dict)
        return altered

    def drop_stream(self, name: str) -> None:
        if self.is_owner:
            self.recover_ddl()
            with self._ddl_lock:
                self.service.apply_drop(name, self._logged("drop", name))
            return
        answer = self._forward("drop", name)
        self.catch_up_ddl(until=int(str(answer["pos"])))

    def owner_apply(self, kind: str, text: str) -> dict[str, object]:
        """Apply a statement another node forwarded (POST /cluster/ddl); its log position."""
        if not self.is_owner:
            raise NotTheOwner(
                f"node {self.name!r} does not order DDL: {self.owner!r} does (STRATA_DDL_OWNER "
                "must name the same node on every node)"
            )
        answer: dict[str, object] = {}
        if kind == "create":
            answer["stream"] = self.create_stream(text).name
        elif kind == "alter":
            answer["altered"] = self.alter_stream(text)
            answer["stream"] = answer["altered"]["stream"]  # type: ignore[index]
        elif kind == "drop":
            self.drop_stream(text)
            answer["stream"] = text
        else:
            raise InvalidSQL(f"unknown DDL kind {kind!r}")
        with self.engine.connect() as connection:
            answer["pos"] = state.ddl_applied(connection)
        return answer

    def ddl_after(self, pos: int) -> list[state.DdlEntry]:
        """This node's copy of the DDL log after ``pos`` (the owner's is the reference)."""
        with self.engine.connect() as connection:
            return state.ddl_after(connection, pos)

    def _logged(self, kind: str, text: str) -> Within:
        """The owner's part of a statement's transaction: its place in the log."""

        def within(connection: sa.Connection, name: str) -> None:
            pos = state.append_ddl(connection, kind, name, text)
            _record(connection, kind, name, pos)

        return within

    def _forward(self, kind: str, text: str) -> dict[str, object]:
        owner = self._owner_peer()
        try:
            # A quick question first: a silent owner costs STRATA_PEER_TIMEOUT, not the
            # minutes a statement may take it.
            owner.hello(self.name, self.incarnation)
            answer = owner.ddl(kind, text)
        except PeerUnreachable:
            raise self._owner_unreachable() from None
        except PeerRefused as refused:
            raise _refusal(kind, refused) from None
        return answer

    def _owner_peer(self) -> Peer:
        for peer in self.peers:
            if peer.name == self.owner:
                return peer
        for peer in self.peers:  # names not learned yet: ask
            if peer.name is None:
                try:
                    peer.hello(self.name, self.incarnation)
                except (PeerUnreachable, PeerRefused):
                    continue
                if peer.name == self.owner:
                    return peer
        raise self._owner_unreachable()

    def _owner_unreachable(self) -> Unavailable:
        return Unavailable(
            f"the DDL owner {self.owner!r} is unreachable from node {self.name!r}: stream DDL "
            "waits for it (runs and reads go on); retry later",
            retry_after=2,
        )

    def catch_up_ddl(self, until: int | None = None) -> bool:
        """Apply the owner's DDL log up to its end (at least up to ``until``, or raise
        Unavailable); whether anything was applied."""
        if self.is_owner:
            return False
        applied_any = False
        with self._ddl_lock:
            while True:
                with self.engine.connect() as connection:
                    applied = state.ddl_applied(connection)
                try:
                    entries = self._owner_peer().ddl_after(applied)["entries"]
                except (PeerUnreachable, Unavailable):
                    if until is not None and applied < until:
                        raise self._owner_unreachable() from None
                    return applied_any
                assert isinstance(entries, list)
                if not entries:
                    return applied_any
                for entry in entries:
                    self._apply(state.DdlEntry(**entry))
                    applied_any = True

    def _apply(self, entry: state.DdlEntry) -> None:
        def within(connection: sa.Connection, name: str) -> None:
            state.insert_ddl(connection, entry)
            _record(connection, entry.kind, name, entry.pos)

        log.info("applying DDL %d of %s: %s %s", entry.pos, self.owner, entry.kind, entry.stream)
        try:
            if entry.kind == "create":
                self.service.apply_create(entry.sql, within)
            elif entry.kind == "alter":
                self.service.apply_alter(entry.sql, within)
            else:
                self.service.apply_drop(entry.stream, within)
        except (StreamExists, UnknownStream) as already:
            # The stream was there before this node joined, or is gone already.
            log.warning("DDL %d (%s %s): %s", entry.pos, entry.kind, entry.stream, already)
            with self.engine.begin() as connection:
                within(connection, entry.stream)

    def recover_ddl(self) -> None:
        """On an owner that holds no DDL log and no stream (a new cluster's, or one whose
        data directory was lost): take the log back from the peers before ordering any
        new statement, so that positions are never given twice. Every peer must answer
        (one of them may lag behind another); the longest log is taken. Raises
        Unavailable until then."""
        if self._log_held:
            return
        logs: list[list[state.DdlEntry]] = []
        for peer in self.peers:
            try:
                peer.hello(self.name, self.incarnation)
                entries = peer.ddl_after(0)["entries"]
            except (PeerUnreachable, PeerRefused) as failed:
                raise Unavailable(
                    f"the DDL owner {self.name!r} started without its DDL log and takes it back "
                    f"from every peer first; {peer.url} is unreachable ({failed}): retry later",
                    retry_after=2,
                ) from None
            assert isinstance(entries, list)
            logs.append([state.DdlEntry(**entry) for entry in entries])
        with self._ddl_lock:
            if self._log_held:
                return
            longest = max(logs, key=len, default=[])
            for entry in longest:
                self._apply(entry)
            with self.engine.begin() as connection:
                state.continue_ddl_log(connection)
            if longest:
                log.info("took the DDL log back from the peers: %d statements", len(longest))
            self._log_held = True

    def seed_ddl_log(self) -> None:
        """On the owner, once: the streams it held before it was a cluster's, as the first
        entries of the log (a single node upgraded into a cluster keeps its streams and
        runs, and gives both to the nodes that join it). An owner with neither log nor
        streams takes the log from its peers (recover_ddl)."""
        if not self.is_owner:
            return
        with self._ddl_lock, self.engine.begin() as connection:
            catalog.lock_ddl(connection)
            if state.ddl_logged(connection):
                self._log_held = True
                return
            records = self.service.plans.load(connection)
            if not records:
                return  # recover_ddl, before the first statement
            self._log_held = True
            made_with = {c for n in records for c in naming_made_with(n, records)}
            for record in records.values():
                if record.name in made_with:
                    continue  # its stream's CREATE makes it
                pos = state.append_ddl(connection, "create", record.name, record.sql)
                _record(connection, "create", record.name, pos)
                connection.execute(
                    sa.update(catalog.runs)
                    .where(catalog.runs.c.stream == record.name, catalog.runs.c.origin.is_(None))
                    .values(origin=pos)
                )
                log.info("stream %s is DDL %d of this cluster", record.name, pos)

    # ---- runs ------------------------------------------------------------------------

    def origin_of(self, stream: str) -> int | None:
        with self.engine.connect() as connection:
            return state.origins(connection).get(stream)

    def accept_replica(
        self,
        stream: str,
        run_id: str,
        origin: int | None,
        table: pa.Table,
        peer: str = "a peer",
    ) -> RunRecord:
        """Take a peer's copy of a run (POST /cluster/runs/{stream}) like any other run."""
        known = self.service.run(run_id)
        if known is not None:
            self.compare(run_id, peer, self._digest_of(run_id), digest(table))
            return known
        if origin is not None and self.origin_of(stream) != origin:
            self.catch_up_ddl()
            if self.origin_of(stream) != origin:
                with self.engine.connect() as connection:
                    applied = state.ddl_applied(connection)
                if applied >= origin:
                    raise ReplicaObsolete(
                        f"run {run_id!r} belongs to stream {stream!r} as DDL {origin} made "
                        "it, which this node has dropped since"
                    )
                raise ReplicaTooEarly(
                    f"stream {stream!r} of DDL {origin} has not reached node {self.name!r} "
                    "yet; offer run {run_id!r} again later"
                )

        def conform(plan: RawStreamPlan) -> pa.Table:
            schema = arrow_schema(plan.columns)
            if table.schema.names != schema.names:
                raise ReplicaObsolete(
                    f"run {run_id!r} has columns {table.schema.names}, stream {stream!r} "
                    f"here {schema.names}"
                )
            return table.cast(schema)

        return self.service.submit_rows(stream, conform, run_id, replica=True)

    def _digest_of(self, run_id: str) -> str | None:
        with self.engine.connect() as connection:
            return state.known_runs(connection, [run_id]).get(run_id)

    def compare(self, run_id: str, peer: str, here: str | None, there: object) -> None:
        """Note a conflict when a peer holds run ``run_id`` with other rows (``there``,
        its digest) than this node (``here``)."""
        if here is None or there is None or here == there:
            return
        log.warning(
            "run %s: rows of digest %s here, %s at %s (the same run id with other rows)",
            run_id,
            here[:12],
            str(there)[:12],
            peer,
        )
        with self.engine.begin() as connection:
            state.note_conflict(connection, run_id, peer, here, str(there))

    def run_facts(self, run_id: str) -> dict[str, object]:
        """What GET /runs/{id} adds in a cluster: ``digest``, that of the rows held here,
        and ``conflict`` where a peer was seen holding other rows: every digest seen, the
        one the cluster's rule chooses (the smallest), the one held here (the chosen one
        once this node has replaced its rows), and why this node cannot replace them, if
        it cannot. One connection reads both."""
        with self.engine.connect() as connection:
            held = state.known_runs(connection, [run_id]).get(run_id)
            noted = state.conflicts_of(connection, run_id)
        facts: dict[str, object] = {"digest": held}
        if not noted or held is None:
            return facts
        digests = sorted({held, *(d for _, kept, other in noted for d in (kept, other))})
        conflict: dict[str, object] = {
            "digests": digests,
            "chosen": min(held, *(other for _, _, other in noted)),
            "held_here": held,
            "peers": sorted(peer for peer, _, _ in noted),
        }
        if run_id in self.unreplaceable:
            conflict["not_replaced"] = self.unreplaceable[run_id]
        facts["conflict"] = conflict
        return facts

    def settle_conflicts(self) -> int:
        """Replace the rows of every run in conflict this node holds other than the
        cluster's choice with the chosen rows, taken from a peer holding them
        (replace.py); how many were replaced."""
        with self.engine.connect() as connection:
            unsettled = state.unsettled(connection)
        replaced = 0
        for run_id, (held, others) in unsettled.items():
            if run_id in self.unreplaceable:
                continue  # said why once; tried again after a restart
            chosen = min(held, *others.values())
            holders = [p for p in self.peers if p.name is not None and others.get(p.name) == chosen]
            for peer in sorted(holders, key=lambda p: not p.reachable):
                try:
                    body = peer.rows(run_id)
                except (PeerUnreachable, PeerRefused) as failed:
                    log.info(
                        "run %s: the chosen rows not taken from %s: %s", run_id, peer.url, failed
                    )
                    continue
                there = digest(body)
                if there != chosen:  # the peer's rows changed meanwhile: a digest more
                    self.compare(run_id, peer.name or peer.url, held, there)
                    continue
                pipeline = self.service.pipeline
                try:
                    done = replace_rows(
                        self.engine,
                        self.service.plans,
                        pipeline.backend,
                        run_id,
                        body,
                        chosen,
                        feed_retention=self.settings.feed_retention,
                    )
                except Unreplaceable as why:
                    if run_id not in self.unreplaceable:
                        log.warning("run %s: its rows here are not replaced: %s", run_id, why)
                    self.unreplaceable[run_id] = str(why)
                    break
                if done:
                    replaced += 1
                    self.unreplaceable.pop(run_id, None)
                break
        return replaced

    def rows_of(self, run_id: str) -> tuple[RunRecord, pa.Table]:
        """A run this node holds, with its rows (from the spool while it is pending, from
        the raw archive once committed)."""
        record = self.service.run(run_id)
        if record is None or record.status == "rejected":
            raise UnknownRun(f"run {run_id!r} is not held by node {self.name!r}")
        with self.engine.connect() as connection:
            plan = self.service.plans.load(connection)[record.stream].plan
            assert isinstance(plan, RawStreamPlan)
            schema = arrow_schema(plan.columns)
            if record.status == "pending" and record.spool_path:
                try:
                    spooled = self.service.spool.read(record.spool_path)
                    return record, spooled.select(schema.names).cast(schema)
                except FileNotFoundError:  # committed meanwhile: its spool file is gone
                    record = self.service.run(run_id) or record
            driver = connection.connection.driver_connection
            assert driver is not None
            with driver.cursor() as cursor:  # type: ignore[attr-defined]
                table = copy_out(cursor, raw_archive_table(plan.name), schema, [record.seq])
        return record, table

    def ensure_copies(self, record: RunRecord, table: pa.Table | None) -> None:
        """Return once run ``record`` is durable on STRATA_MIN_COPIES nodes (this one and
        peers it gave a copy to), else raise Unavailable: the run is not acknowledged."""
        wanted = self.min_copies - 1
        if wanted <= 0 or record.status == "rejected":
            return
        if table is None:
            record, table = self.rows_of(record.run_id)
        origin = self.origin_of(record.stream)
        copies = 0
        # Reachable peers first: a dead one costs a timeout.
        for peer in sorted(self.peers, key=lambda p: not p.reachable):
            try:
                peer.offer(record.stream, record.run_id, origin, table, self.name)
            except (PeerUnreachable, PeerRefused) as failed:
                log.warning("run %s: no copy at %s: %s", record.run_id, peer.url, failed)
                continue
            copies += 1
            if copies >= wanted:
                return
        raise Unavailable(
            f"run {record.run_id!r} is durable on {copies + 1} node(s), fewer than the "
            f"{self.min_copies} STRATA_MIN_COPIES asks for: it is not acknowledged. Post it "
            "again with the same run id, here or at another node (it is never made twice)"
        )

    # ---- what GET /cluster says ------------------------------------------------------

    def log_answer(
        self, after: int, limit: int, peer: str | None, incarnation: str | None
    ) -> dict[str, object]:
        """GET /cluster/log: this node's commit log after ``after``, and what it knows of
        the asking peer (its cursor on that peer's log)."""
        with self.engine.connect() as connection:
            runs = state.committed_after(connection, after, limit) if limit else []
            answer: dict[str, object] = {
                "node": self.name,
                "incarnation": self.incarnation,
                "ddl_owner": self.owner,
                "commit_position": state.commit_position(connection),
                "behind_you": state.committed_after_count(connection, after),
                "runs": [r.to_dict() for r in runs],
            }
            if peer is not None and incarnation is not None:
                answer["your_runs_here"] = state.cursor(connection, peer, incarnation)
        return answer

    def status(self) -> dict[str, object]:
        """GET /cluster: this node, the DDL owner, and per peer whether it is reachable
        and how many runs each side is behind the other, and since when."""
        now = time.time()
        with self.engine.connect() as connection:
            position = state.commit_position(connection)
            peers = []
            for peer in self.peers:
                facts = peer.facts
                mine = facts.get("your_runs_here")
                peers.append(
                    {
                        "url": peer.url,
                        "name": peer.name,
                        "reachable": peer.reachable,
                        "last_seen_seconds_ago": None
                        if peer.last_seen is None
                        else round(now - peer.last_seen, 3),
                        "unreachable_for_seconds": None
                        if peer.unreachable_since is None
                        else round(now - peer.unreachable_since, 3),
                        "error": peer.last_error,
                        # Runs the peer committed that this node has not taken yet, and
                        # runs this node committed that the peer has not, as last seen.
                        "runs_behind_peer": facts.get("behind_you"),
                        "peer_runs_behind": None
                        if mine is None
                        else state.committed_after_count(connection, int(str(mine))),
                        "behind_since_seconds": None
                        if peer.behind_since is None
                        else round(now - peer.behind_since, 3),
                    }
                )
            return {
                "node": self.name,
                "incarnation": self.incarnation,
                "ddl_owner": self.owner,
                "is_ddl_owner": self.is_owner,
                "min_copies": self.min_copies,
                "commit_position": position,
                "runs": state.committed_count(connection),
                "ddl_applied": state.ddl_applied(connection),
                "conflicts": state.conflict_count(connection),
                "peers": peers,
            }


def _record(connection: sa.Connection, kind: str, name: str, pos: int) -> None:
    """What applying DDL entry ``pos`` leaves in the catalog, in its own transaction."""
    if kind == "create":
        state.set_origin(connection, name, pos)
    elif kind == "drop":
        state.set_origin(connection, name, None)
    state.set_ddl_applied(connection, pos)


def _refusal(kind: str, refused: PeerRefused) -> StrataError:
    """The owner's 4xx as the error it was there."""
    if refused.status == 409:
        return (StreamInUse if kind == "drop" else StreamExists)(refused.error)
    return _REFUSALS.get(refused.status, InvalidSQL)(refused.error)
