"""gate history: a gate's spec identity, whether it is an A/A gate, its history entry

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-07
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("gates") as batch:
        batch.add_column(sa.Column("identity", sa.String(length=16), nullable=True))
        batch.add_column(sa.Column("aa", sa.Boolean(), nullable=True))
        batch.add_column(sa.Column("history", sa.JSON(none_as_null=True), nullable=True))
        batch.create_index("ix_gates_identity_finished", ["identity", "finished_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("gates") as batch:
        batch.drop_index("ix_gates_identity_finished")
        batch.drop_column("history")
        batch.drop_column("aa")
        batch.drop_column("identity")
