-- strata_grant_reader as migration 0010 created it (frozen: sql/004_reader.sql holds the
-- current definition, installed at every start).
CREATE OR REPLACE FUNCTION public.strata_grant_reader(relation regclass)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    EXECUTE format('GRANT SELECT ON %s TO strata_reader', relation);
END
$$;
