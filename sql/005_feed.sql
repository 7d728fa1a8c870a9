-- The change feed's watch on the PostgreSQL tables a followed stream joins on read
-- (server/feed/tables.py): a statement trigger, created on each such table when its feed
-- starts, counts the statements that change it in strata_catalog.table_versions, in the
-- changing transaction. The feed announces the whole view anew (cause 'table') when the
-- counts it last saw move. Installed at every start with the rest of sql/
-- (sql/001_functions.sql says how); migration 0020 made the table.
--
-- It runs as its owner, so that a role allowed to change the table need not write the
-- catalog; its search path holds no schema a caller could add objects to. Concurrent
-- statements changing one table queue on its row here until each commits.
CREATE OR REPLACE FUNCTION public.strata_table_changed()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    INSERT INTO strata_catalog.table_versions AS v (relation, version) VALUES (TG_RELID, 1)
    ON CONFLICT (relation) DO UPDATE SET version = v.version + 1;
    RETURN NULL;
END
$$;
