-- PostgreSQL functions Strata installs (by migration 0001). Safe to run more than once.

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
