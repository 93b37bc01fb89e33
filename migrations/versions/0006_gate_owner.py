"""gate owner: the token (or the CI webhook) that started a gate; only it or an admin cancels

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("gates") as batch:
        batch.add_column(sa.Column("owner", sa.String(length=64), nullable=True))
        batch.create_index(batch.f("ix_gates_owner"), ["owner"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("gates") as batch:
        batch.drop_index(batch.f("ix_gates_owner"))
        batch.drop_column("owner")
