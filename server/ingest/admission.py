"""What a new run must pass before its body is read, over HTTP and over the SQL port: a
valid run id, and room in the spool (STRATA_MAX_SPOOL_BYTES, STRATA_MAX_SPOOL_SECONDS)."""

from __future__ import annotations

import asyncio
import time
import unicodedata

from server.errors import InvalidRunId, SpoolFull
from server.service import StrataService
from server.settings import Settings

MAX_RUN_ID = 256
# A client told to come back later (429, or SQLSTATE 53000 over the SQL port) is asked to
# wait this long.
RETRY_AFTER_SECONDS = 2
_SPOOL_POLL_SECONDS = 0.2


def check_run_id(run_id: str) -> str:
    """A run id is 1 to MAX_RUN_ID characters, none of them a control character."""
    if len(run_id) > MAX_RUN_ID:
        raise InvalidRunId(
            f"run id of {len(run_id)} characters is too long; at most {MAX_RUN_ID} are allowed"
        )
    bad = next((c for c in run_id if unicodedata.category(c) in ("Cc", "Cs")), None)
    if bad is not None:
        raise InvalidRunId(
            f"run id {run_id[:80]!r} holds U+{ord(bad):04X}, a control character or a lone "
            "surrogate; use printable characters"
        )
    return run_id


async def admit(service: StrataService, settings: Settings, run_id: str | None) -> None:
    """Hold a new run back while the spool is full: it holds STRATA_MAX_SPOOL_BYTES, or its
    oldest run has waited STRATA_MAX_SPOOL_SECONDS for its commit. Refuse the run
    (SpoolFull) or, with STRATA_SPOOL_FULL=wait, wait a bounded time for room.

    Checked before the body is read, so a full spool costs neither memory nor disk. A run
    id already known passes: its answer is the first result, which takes no room.
    """
    if settings.max_spool_bytes <= 0 and settings.max_spool_seconds <= 0:
        return
    waiting = settings.spool_full_wait if settings.spool_full == "wait" else 0.0
    deadline = time.monotonic() + waiting
    while True:
        full = await asyncio.to_thread(_full, service, settings)
        if full is None:
            return
        if run_id and await asyncio.to_thread(service.run, run_id) is not None:
            return
        if time.monotonic() >= deadline:
            waited = f" after waiting {waiting:g} s" if waiting else ""
            raise SpoolFull(
                f"the run spool is full{waited}: {full}; retry later",
                retry_after=RETRY_AFTER_SECONDS,
            )
        await asyncio.sleep(_SPOOL_POLL_SECONDS)


def _full(service: StrataService, settings: Settings) -> str | None:
    """Why the spool takes no new run now, or None when it does."""
    pending = service.spool.pending()
    limit, bound = settings.max_spool_bytes, settings.max_spool_seconds
    if 0 < limit <= pending.bytes:
        return (
            f"{pending.bytes} bytes of runs await their commit (limit {limit}, "
            "STRATA_MAX_SPOOL_BYTES)"
        )
    if 0 < bound <= pending.oldest_seconds:
        return (
            f"its oldest run has waited {pending.oldest_seconds:.1f} s for its commit (limit "
            f"{bound:g} s, STRATA_MAX_SPOOL_SECONDS): runs arrive faster than they commit"
        )
    return None
