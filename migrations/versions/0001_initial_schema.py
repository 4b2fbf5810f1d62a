"""Initial schema: installations, repositories, deliveries, scans and their history, findings,
change sets, results, pull requests, ignored identities, task runs.

Revision ID: 0001
Revises:
Create Date: 2026-11-30 11:27:39.761199
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table(
        "deliveries",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("event", sa.String(length=64), nullable=False),
        sa.Column("action", sa.String(length=64), nullable=True),
        sa.Column("installation_id", sa.BigInteger(), nullable=True),
        sa.Column("repository_id", sa.BigInteger(), nullable=True),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("processed_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_deliveries")),
    )
    with op.batch_alter_table("deliveries", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_deliveries_event"), ["event"], unique=False)
        batch_op.create_index(batch_op.f("ix_deliveries_status"), ["status"], unique=False)

    op.create_table(
        "installations",
        sa.Column("id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("account_login", sa.String(length=255), nullable=False),
        sa.Column("account_type", sa.String(length=32), nullable=True),
        sa.Column("permissions", sa.JSON(), nullable=False),
        sa.Column("suspended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_installations")),
    )
    op.create_table(
        "repositories",
        sa.Column("id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("installation_id", sa.BigInteger(), nullable=False),
        sa.Column("full_name", sa.String(length=255), nullable=False),
        sa.Column("private", sa.Boolean(), nullable=False),
        sa.Column("default_branch", sa.String(length=255), nullable=True),
        sa.Column("removed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["installation_id"],
            ["installations.id"],
            name=op.f("fk_repositories_installation_id_installations"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_repositories")),
    )
    with op.batch_alter_table("repositories", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_repositories_full_name"), ["full_name"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_repositories_installation_id"), ["installation_id"], unique=False
        )

    op.create_table(
        "ignored_identities",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("repository_id", sa.BigInteger(), nullable=False),
        sa.Column("identity", sa.String(length=255), nullable=False),
        sa.Column("code_digest", sa.String(length=64), nullable=True),
        sa.Column("reason", sa.String(length=255), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["repository_id"],
            ["repositories.id"],
            name=op.f("fk_ignored_identities_repository_id_repositories"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ignored_identities")),
        sa.UniqueConstraint("repository_id", "identity", name="uq_ignored_identities_repository_identity"),
    )
    with op.batch_alter_table("ignored_identities", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_ignored_identities_repository_id"), ["repository_id"], unique=False
        )

    op.create_table(
        "scans",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("repository_id", sa.BigInteger(), nullable=False),
        sa.Column("delivery_id", sa.String(length=64), nullable=True),
        sa.Column("trigger", sa.String(length=32), nullable=False),
        sa.Column("head_sha", sa.String(length=40), nullable=True),
        sa.Column("branch", sa.String(length=255), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("force_recreate", sa.Boolean(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=True),
        sa.Column("diff", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["delivery_id"], ["deliveries.id"], name=op.f("fk_scans_delivery_id_deliveries")
        ),
        sa.ForeignKeyConstraint(
            ["repository_id"], ["repositories.id"], name=op.f("fk_scans_repository_id_repositories")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_scans")),
        sa.UniqueConstraint("delivery_id", "repository_id", name="uq_scans_delivery_repository"),
    )
    with op.batch_alter_table("scans", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_scans_repository_id"), ["repository_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_scans_state"), ["state"], unique=False)

    op.create_table(
        "change_sets",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("scan_id", sa.Integer(), nullable=False),
        sa.Column("identity", sa.String(length=255), nullable=False),
        sa.Column("rule_ids", sa.JSON(), nullable=False),
        sa.Column("files", sa.JSON(), nullable=False),
        sa.Column("diff", sa.Text(), nullable=False),
        sa.Column("code_digest", sa.String(length=64), nullable=False),
        sa.Column("outcome", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["scan_id"], ["scans.id"], name=op.f("fk_change_sets_scan_id_scans"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_change_sets")),
        sa.UniqueConstraint("scan_id", "identity", name="uq_change_sets_scan_identity"),
    )
    with op.batch_alter_table("change_sets", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_change_sets_scan_id"), ["scan_id"], unique=False)

    op.create_table(
        "findings",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("scan_id", sa.Integer(), nullable=False),
        sa.Column("rule_id", sa.String(length=128), nullable=False),
        sa.Column("path", sa.String(length=1024), nullable=False),
        sa.Column("line", sa.Integer(), nullable=False),
        sa.Column("end_line", sa.Integer(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("message", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["scan_id"], ["scans.id"], name=op.f("fk_findings_scan_id_scans"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_findings")),
    )
    with op.batch_alter_table("findings", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_findings_scan_id"), ["scan_id"], unique=False)

    op.create_table(
        "pull_requests",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("repository_id", sa.BigInteger(), nullable=False),
        sa.Column("identity", sa.String(length=255), nullable=False),
        sa.Column("branch", sa.String(length=255), nullable=False),
        sa.Column("base_branch", sa.String(length=255), nullable=False),
        sa.Column("number", sa.Integer(), nullable=True),
        sa.Column("title", sa.String(length=255), nullable=False),
        sa.Column("html_url", sa.String(length=1024), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("head_sha", sa.String(length=40), nullable=True),
        sa.Column("base_sha", sa.String(length=40), nullable=True),
        sa.Column("code_digest", sa.String(length=64), nullable=True),
        sa.Column("content_digest", sa.String(length=64), nullable=True),
        sa.Column("person_pushed", sa.Boolean(), nullable=False),
        sa.Column("last_scan_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("closed_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["last_scan_id"], ["scans.id"], name=op.f("fk_pull_requests_last_scan_id_scans")
        ),
        sa.ForeignKeyConstraint(
            ["repository_id"], ["repositories.id"], name=op.f("fk_pull_requests_repository_id_repositories")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_pull_requests")),
        sa.UniqueConstraint("repository_id", "identity", name="uq_pull_requests_repository_identity"),
    )
    with op.batch_alter_table("pull_requests", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_pull_requests_repository_id"), ["repository_id"], unique=False)
        batch_op.create_index("ix_pull_requests_repository_number", ["repository_id", "number"], unique=False)

    op.create_table(
        "scan_events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("scan_id", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["scan_id"], ["scans.id"], name=op.f("fk_scan_events_scan_id_scans"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_scan_events")),
    )
    with op.batch_alter_table("scan_events", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_scan_events_scan_id"), ["scan_id"], unique=False)

    op.create_table(
        "task_runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("task", sa.String(length=64), nullable=False),
        sa.Column("scan_id", sa.Integer(), nullable=True),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("duration_s", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["scan_id"], ["scans.id"], name=op.f("fk_task_runs_scan_id_scans"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_task_runs")),
    )
    with op.batch_alter_table("task_runs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_task_runs_task"), ["task"], unique=False)

    op.create_table(
        "results",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("change_set_id", sa.Integer(), nullable=False),
        sa.Column("verified", sa.Boolean(), nullable=False),
        sa.Column("max_abs_error", sa.Float(), nullable=True),
        sa.Column("device", sa.String(length=64), nullable=True),
        sa.Column("before_s", sa.Float(), nullable=True),
        sa.Column("after_s", sa.Float(), nullable=True),
        sa.Column("speedup", sa.Float(), nullable=True),
        sa.Column("peak_mem_before", sa.BigInteger(), nullable=True),
        sa.Column("peak_mem_after", sa.BigInteger(), nullable=True),
        sa.Column("versions", sa.JSON(), nullable=False),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["change_set_id"],
            ["change_sets.id"],
            name=op.f("fk_results_change_set_id_change_sets"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_results")),
        sa.UniqueConstraint("change_set_id", name=op.f("uq_results_change_set_id")),
    )


def downgrade() -> None:

    op.drop_table("results")
    with op.batch_alter_table("task_runs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_task_runs_task"))

    op.drop_table("task_runs")
    with op.batch_alter_table("scan_events", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_scan_events_scan_id"))

    op.drop_table("scan_events")
    with op.batch_alter_table("pull_requests", schema=None) as batch_op:
        batch_op.drop_index("ix_pull_requests_repository_number")
        batch_op.drop_index(batch_op.f("ix_pull_requests_repository_id"))

    op.drop_table("pull_requests")
    with op.batch_alter_table("findings", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_findings_scan_id"))

    op.drop_table("findings")
    with op.batch_alter_table("change_sets", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_change_sets_scan_id"))

    op.drop_table("change_sets")
    with op.batch_alter_table("scans", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_scans_state"))
        batch_op.drop_index(batch_op.f("ix_scans_repository_id"))

    op.drop_table("scans")
    with op.batch_alter_table("ignored_identities", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_ignored_identities_repository_id"))

    op.drop_table("ignored_identities")
    with op.batch_alter_table("repositories", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_repositories_installation_id"))
        batch_op.drop_index(batch_op.f("ix_repositories_full_name"))

    op.drop_table("repositories")
    op.drop_table("installations")
    with op.batch_alter_table("deliveries", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_deliveries_status"))
        batch_op.drop_index(batch_op.f("ix_deliveries_event"))

    op.drop_table("deliveries")
