-- PostgreSQL functions the plans rely on: window starts and HOP windows.
--
-- How sql/ is installed (this holds for every file here): the server runs all of sql/*.sql,
-- in file name order and in one transaction, at every start after the migrations, unless
-- the same files were installed last (strata_catalog.function_installs keeps their
-- sha256). A fix here thus reaches every existing database at its next start. So every
-- statement must be re-runnable: CREATE OR REPLACE FUNCTION / AGGREGATE, and each function
-- spelt out whole (CREATE OR REPLACE resets SECURITY DEFINER, SET, STRICT ... to what the
-- statement says; owner and privileges stay). CREATE OR REPLACE cannot change a function's
-- argument types or names, its return type, or an aggregate's kind, arguments or result:
-- such a change needs a new migration that drops the old object first (and re-creates the
-- stream views that use it), or a new function under a new name. Migrations never read
-- these files: each one runs a frozen copy of what it installed (migrations/versions/sql).

-- Start of the epoch-aligned window of size_us microseconds holding t: the same
-- arithmetic Spark applies to every run (t - (t mod size), in microseconds, UTC). date_bin
-- floors exactly in integer microseconds for any year (numeric epoch arithmetic rounds
-- far from 1970). Handy for checking a view against a batch query over the raw archive:
--   SELECT strata_window_start(t, 60000000) AS w, count(*) FROM impsns GROUP BY w;
CREATE OR REPLACE FUNCTION public.strata_window_start(t timestamptz, size_us bigint)
RETURNS timestamptz
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
  SELECT date_bin(size_us * interval '1 microsecond', t, timestamptz 'epoch')
$$;

-- The HOP windows (slide_us apart, size_us long, epoch-aligned) that contain the pane of
-- pane_us microseconds starting at pane_start: every s on the slide grid with
-- pane_start + pane_us - size_us <= s <= pane_start. A HOP stream keeps partials per pane;
-- its view counts each pane in each of these windows.
CREATE OR REPLACE FUNCTION public.strata_hop_windows(
  pane_start timestamptz, pane_us bigint, slide_us bigint, size_us bigint)
RETURNS SETOF timestamptz
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
  SELECT generate_series(
    date_bin(slide_us * interval '1 microsecond',
             pane_start + (pane_us - size_us + slide_us - 1) * interval '1 microsecond',
             timestamptz 'epoch'),
    pane_start,
    slide_us * interval '1 microsecond')
$$;
