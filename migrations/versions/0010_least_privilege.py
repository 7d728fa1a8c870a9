"""Least privilege for the dashboard role strata_reader: the stream views, each by name.

Migration 0006 let strata_reader SELECT every table created in public from then on
(default privileges), so any table of the owner's there - the dimension tables streams
join, say - was readable by dashboards. This migration revokes that default, revokes the
reader's privileges on whatever in public is not a stream view (granted by the default,
or by 0006 itself), and adds public.strata_grant_reader(regclass): Strata calls it for the
view of every stream it creates, and so does a migration adding another view meant for
dashboards (such as strata_window_status). Whatever else dashboards should read is its
owner's explicit GRANT.

Revision ID: 0010
Revises: 0009
"""

from pathlib import Path

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

READER = "strata_reader"
CATALOG = "strata_catalog"
GRANT_READER = "public.strata_grant_reader(regclass)"
# The SQL this migration ran when it was written, frozen: the migration builds the same
# schema whatever sql/ holds later (sql/004_reader.sql, installed at every start).
FROZEN_SQL = Path(__file__).resolve().parent / "sql"

# The default of 0006 was set by the role that ran it, usually the one running this; any
# other role's default naming the reader is revoked too where we may (as superuser).
REVOKE_DEFAULTS = f"""
DO $$
DECLARE
    owner regrole;
BEGIN
    FOR owner IN
        SELECT d.defaclrole::regrole
          FROM pg_default_acl d
         WHERE d.defaclnamespace = 'public'::regnamespace AND d.defaclobjtype = 'r'
           AND EXISTS (SELECT FROM aclexplode(d.defaclacl) a
                        WHERE a.grantee = '{READER}'::regrole)
    LOOP
        BEGIN
            EXECUTE format('ALTER DEFAULT PRIVILEGES FOR ROLE %s IN SCHEMA public '
                           'REVOKE ALL ON TABLES FROM {READER}', owner);
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE WARNING '{READER} keeps SELECT on new tables of % in public: %',
                owner, SQLERRM;
        END;
    END LOOP;
END
$$
"""

# Everything in public the reader may read that is no stream's view: the owner's own
# tables, which 0006's default made readable without anyone asking.
REVOKE_OTHERS = f"""
DO $$
DECLARE
    relation regclass;
BEGIN
    FOR relation IN
        SELECT c.oid::regclass
          FROM pg_class c
         WHERE c.relnamespace = 'public'::regnamespace
           AND c.relname NOT IN (SELECT name FROM {CATALOG}.streams)
           AND EXISTS (SELECT FROM aclexplode(c.relacl) a WHERE a.grantee = '{READER}'::regrole)
    LOOP
        BEGIN
            EXECUTE format('REVOKE ALL ON %s FROM {READER}', relation);
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE WARNING '{READER} keeps its privileges on %: %', relation, SQLERRM;
        END;
    END LOOP;
END
$$
"""

GRANT_STREAM_VIEWS = f"""
SELECT {GRANT_READER.split("(")[0]}(c.oid::regclass)
  FROM pg_class c
 WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('v', 'm')
   AND c.relname IN (SELECT name FROM {CATALOG}.streams)
"""


def upgrade() -> None:
    op.execute(REVOKE_DEFAULTS)
    op.execute(REVOKE_OTHERS)
    op.execute((FROZEN_SQL / "0010_least_privilege.sql").read_text())
    # Run by Strata's own role, which owns the views it grants on; nobody else may call it
    # (0006's default privileges would let the reader), although GRANT would refuse them.
    op.execute(f"REVOKE ALL ON FUNCTION {GRANT_READER} FROM PUBLIC, {READER}")
    op.execute(GRANT_STREAM_VIEWS)


def downgrade() -> None:
    op.execute(f"DROP FUNCTION {GRANT_READER}")
    # 0006's state: SELECT on everything in public, now and later.
    op.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {READER}")
    op.execute(f"ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT ON TABLES TO {READER}")
