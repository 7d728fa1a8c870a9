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
