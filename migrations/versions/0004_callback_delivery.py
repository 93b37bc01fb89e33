"""callback delivery: attempts, last try, sent, result (reapers retry unsent callbacks)

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("gates") as batch:
        batch.add_column(
            sa.Column("callback_attempts", sa.Integer(), server_default="0", nullable=False)
        )
        batch.add_column(sa.Column("callback_tried_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("callback_sent_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("callback_result", sa.String(length=200), nullable=True))
    # "No callback" was stored as JSON null before; SQL NULL now, so reapers can index it.
    op.execute("UPDATE gates SET callback = NULL WHERE CAST(callback AS TEXT) = 'null'")


def downgrade() -> None:
    with op.batch_alter_table("gates") as batch:
        batch.drop_column("callback_result")
        batch.drop_column("callback_sent_at")
        batch.drop_column("callback_tried_at")
        batch.drop_column("callback_attempts")
