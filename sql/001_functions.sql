-- PostgreSQL functions Strata installs (by migration 0001). Safe to run more than once.

-- Start of the epoch-aligned window of size_us microseconds holding t: the same
-- arithmetic Spark applies to every run (t - (t mod size), in microseconds, UTC), done in
-- exact numeric. Handy for checking a view against a batch query over the raw archive:
--   SELECT strata_window_start(t, 60000000) AS w, count(*) FROM impsns GROUP BY w;
CREATE OR REPLACE FUNCTION public.strata_window_start(t timestamptz, size_us bigint)
RETURNS timestamptz
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
  SELECT timestamptz 'epoch'
         + (floor(extract(epoch FROM t) * 1000000 / size_us) * size_us) * interval '1 microsecond'
$$;
