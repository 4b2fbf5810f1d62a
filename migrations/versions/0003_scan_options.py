"""Scans remember the options they ran with (rules, verify/bench, device, rounds, ...), apart from
the repository's configuration file, so the dashboard can show how each scan was run.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 11:20:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("scans", schema=None) as batch_op:
        batch_op.add_column(sa.Column("options", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("scans", schema=None) as batch_op:
        batch_op.drop_column("options")
