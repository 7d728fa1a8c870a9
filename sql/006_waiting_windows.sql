-- The windows of aggregate streams whose partial rows wait for the reducer, listed as the
-- rows are added: each stream's partial archive calls this after every statement that
-- inserts into it (a run's commit, a back-fill, a replica's copy), with that statement's
-- rows as new_rows, in the same transaction. Views merge the listed windows on read
-- (each stream's strata_waiting_* function reads strata_internal.waiting_windows, which
-- migration 0030 made); the reducer's fold unlists a window at the generation it read, so
-- a window listed again by a commit racing the fold stays listed. Installed at every start
-- with the rest of sql/ (sql/001_functions.sql says how).
--
-- In window order, so that two commits listing the same windows lock their rows in one
-- order (neither waits for the other while holding what the other wants). Run with the
-- inserting role's privileges (Strata's own), under a search path no one can shadow.
CREATE OR REPLACE FUNCTION strata_internal.strata_list_waiting_windows()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    INSERT INTO strata_internal.waiting_windows AS w (archive, window_start)
    SELECT DISTINCT TG_RELID::regclass, n.window_start FROM new_rows AS n ORDER BY 2
    ON CONFLICT (archive, window_start) DO UPDATE SET generation = w.generation + 1;
    RETURN NULL;
END
$$;
