"""The dashboard role strata_reader: SELECT on the stream views in public, nothing else.

Roles are cluster-wide, so the role may already exist (another database on the same server
ran this migration, or an administrator created it): it is created only when missing, and
never dropped. Its password is not set here but at every start (STRATA_READER_PASSWORD);
a role created here is NOLOGIN until then.

Views run with their owner's privileges, so SELECT on a view is all the reader needs to
read it; functions called inside a view run with the caller's privileges, so the two
functions that read the catalog for serial streams become SECURITY DEFINER.

Revision ID: 0006
Revises: 0005
"""

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

READER = "strata_reader"
CATALOG = "strata_catalog"
# Functions that read catalog tables on behalf of the views that call them.
CATALOG_READERS = ("public.strata_serial_until(text)", "public.strata_serial_corrected(text)")

CREATE_ROLE = f"""
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{READER}') THEN
        BEGIN
            CREATE ROLE {READER} NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION;
        EXCEPTION
            -- Created meanwhile by a migration of another database on this server.
            WHEN duplicate_object OR unique_violation THEN NULL;
            WHEN insufficient_privilege THEN
                RAISE EXCEPTION 'Strata needs the role {READER} for dashboards, and its '
                    'database user % may not create roles', current_user
                USING HINT = 'Create it once as an administrator: CREATE ROLE {READER} '
                    'NOLOGIN; (or give Strata''s user CREATEROLE), then start Strata again.';
        END;
    END IF;
END
$$
"""


def _tolerant(what: str, statement: str) -> str:
    """`statement` in a block that shrugs off missing ownership (e.g. of schema public when
    Strata's user does not own the database): PUBLIC holds these privileges by default."""
    return f"""
DO $$
BEGIN
    {statement};
EXCEPTION WHEN insufficient_privilege THEN
    RAISE NOTICE '{READER}: {what} skipped: %', SQLERRM;
END
$$
"""


# SELECT on the views of the streams that exist already; later ones get it by default.
GRANT_EXISTING_VIEWS = f"""
DO $$
DECLARE
    view regclass;
BEGIN
    FOR view IN
        SELECT c.oid::regclass
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = 'public' AND c.relkind IN ('v', 'm')
           AND c.relname IN (SELECT name FROM {CATALOG}.streams)
    LOOP
        EXECUTE format('GRANT SELECT ON %s TO {READER}', view);
    END LOOP;
END
$$
"""

# EXECUTE on Strata's functions and aggregates, in case PUBLIC lost it.
GRANT_FUNCTIONS = f"""
DO $$
DECLARE
    routine regprocedure;
BEGIN
    FOR routine IN
        SELECT p.oid::regprocedure
          FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = 'public' AND p.proname LIKE 'strata\\_%' AND p.prokind IN ('f', 'a')
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO {READER}', routine);
    END LOOP;
END
$$
"""


def upgrade() -> None:
    op.execute(CREATE_ROLE)
    op.execute(
        _tolerant(
            "GRANT CONNECT",
            f"EXECUTE format('GRANT CONNECT ON DATABASE %I TO {READER}', current_database())",
        )
    )
    op.execute(_tolerant("GRANT USAGE", f"GRANT USAGE ON SCHEMA public TO {READER}"))
    # PostgreSQL before 15 lets every role create objects in public; the reader must not.
    op.execute(_tolerant("REVOKE CREATE", "REVOKE CREATE ON SCHEMA public FROM PUBLIC"))
    op.execute(GRANT_EXISTING_VIEWS)
    op.execute(GRANT_FUNCTIONS)
    # Every stream view Strata creates from now on (as the user running this migration).
    op.execute(f"ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT ON TABLES TO {READER}")
    op.execute(f"ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT EXECUTE ON FUNCTIONS TO {READER}")
    # Called from serial streams' views by whoever reads them: they read the catalog as
    # their owner, with a search path no caller can shadow. Only the stream name is input.
    for function in CATALOG_READERS:
        op.execute(
            f"ALTER FUNCTION {function} SECURITY DEFINER SET search_path = pg_catalog, pg_temp"
        )


def downgrade() -> None:
    for function in CATALOG_READERS:
        op.execute(f"ALTER FUNCTION {function} SECURITY INVOKER RESET search_path")
    op.execute(
        f"ALTER DEFAULT PRIVILEGES IN SCHEMA public REVOKE EXECUTE ON FUNCTIONS FROM {READER}"
    )
    op.execute(f"ALTER DEFAULT PRIVILEGES IN SCHEMA public REVOKE SELECT ON TABLES FROM {READER}")
    op.execute(f"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {READER}")
    op.execute(f"REVOKE ALL ON ALL FUNCTIONS IN SCHEMA public FROM {READER}")
    op.execute(_tolerant("REVOKE USAGE", f"REVOKE USAGE ON SCHEMA public FROM {READER}"))
    op.execute(
        _tolerant(
            "REVOKE CONNECT",
            f"EXECUTE format('REVOKE CONNECT ON DATABASE %I FROM {READER}', current_database())",
        )
    )
    # The role itself stays: it is shared by every database on the server.
