-- The dashboard role strata_reader reads the views meant for dashboards, each granted by
-- name: Strata calls this for the view of every stream it creates (server/service.py),
-- and a migration adding another such view (strata_window_status) calls it too. Nothing
-- else of public is the reader's unless its owner grants it. Installed at every start with
-- the rest of sql/ (sql/001_functions.sql says how); migration 0010 created it, and took
-- EXECUTE from everyone but its owner (privileges stay when it is replaced).
--
-- Its search path holds no schema a caller could add objects to; the view's name comes
-- quoted and schema-qualified from regclass.
CREATE OR REPLACE FUNCTION public.strata_grant_reader(relation regclass)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    EXECUTE format('GRANT SELECT ON %s TO strata_reader', relation);
END
$$;
