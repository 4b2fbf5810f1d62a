"""Findings keep where they are as SARIF states it (columns of every matched node, related locations,
the fingerprint, class, method and guard), computed while the scan has the checkout, so the
code-scanning upload of the publish step, which has no files, equals the command line's SARIF.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 19:50:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("findings", schema=None) as batch_op:
        batch_op.add_column(sa.Column("locations", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("related_locations", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("fingerprint", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("class_name", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("method_name", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("guard", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("findings", schema=None) as batch_op:
        for column in ("guard", "method_name", "class_name", "fingerprint", "related_locations", "locations"):
            batch_op.drop_column(column)
