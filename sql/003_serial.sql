-- Serial streams read their archive for windows already materialized and not awaiting
-- repair, and compute the rest on read. Both functions are STABLE: within one query they
-- see that query's snapshot, so the archive and the list of corrected windows agree.
-- Installed at every start with the rest of sql/ (sql/001_functions.sql says how).
--
-- Views of serial streams call them on behalf of whoever reads the view, strata_reader
-- included, who may not read the catalog: they read it as their owner (SECURITY DEFINER),
-- with a search path no caller can shadow. Migration 0006 first set these two attributes;
-- they are spelt out here because CREATE OR REPLACE would otherwise reset them.

-- Windows starting before this are in the stream's archive ('-infinity': none yet).
CREATE OR REPLACE FUNCTION public.strata_serial_until(stream text)
RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce(
        (SELECT materialized_until FROM strata_catalog.serial_progress p
          WHERE p.stream = strata_serial_until.stream),
        '-infinity'::timestamptz)
$$;

-- Archived windows that late data has changed since; computed on read until repaired.
CREATE OR REPLACE FUNCTION public.strata_serial_corrected(stream text)
RETURNS timestamptz[]
LANGUAGE sql STABLE PARALLEL SAFE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce(array_agg(window_start), '{}')
      FROM strata_catalog.corrections c
     WHERE c.stream = strata_serial_corrected.stream
$$;
