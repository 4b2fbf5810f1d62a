"""Change sets remember the digest of what verification depends on, so equal inputs reuse results.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 11:42:23.225081
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("change_sets", schema=None) as batch_op:
        batch_op.add_column(sa.Column("inputs_digest", sa.String(length=64), nullable=True))
        batch_op.create_index(batch_op.f("ix_change_sets_inputs_digest"), ["inputs_digest"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("change_sets", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_change_sets_inputs_digest"))
        batch_op.drop_column("inputs_digest")
