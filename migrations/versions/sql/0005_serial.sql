-- Serial streams read their archive for windows already materialized and not awaiting
-- repair, and compute the rest on read. Both functions are STABLE: within one query they
-- see that query's snapshot, so the archive and the list of corrected windows agree.

-- Windows starting before this are in the stream's archive ('-infinity': none yet).
CREATE OR REPLACE FUNCTION public.strata_serial_until(stream text)
RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT coalesce(
        (SELECT materialized_until FROM strata_catalog.serial_progress p
          WHERE p.stream = strata_serial_until.stream),
        '-infinity'::timestamptz)
$$;

-- Archived windows that late data has changed since; computed on read until repaired.
CREATE OR REPLACE FUNCTION public.strata_serial_corrected(stream text)
RETURNS timestamptz[]
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT coalesce(array_agg(window_start), '{}')
      FROM strata_catalog.corrections c
     WHERE c.stream = strata_serial_corrected.stream
$$;
