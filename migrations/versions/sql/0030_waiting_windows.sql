-- Migration 0030: the table of windows whose partial rows wait for the reducer, and the
-- trigger function that lists them (sql/006_waiting_windows.sql holds today's).
CREATE TABLE IF NOT EXISTS strata_internal.waiting_windows (
    archive regclass NOT NULL,
    window_start timestamptz NOT NULL,
    generation bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (archive, window_start)
);

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
