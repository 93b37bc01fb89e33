"""alert deliveries: verdict alerts of each gate to each target, attempts and last status

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-07
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "alert_deliveries",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("gate_id", sa.String(length=32), nullable=False),
        sa.Column("target", sa.String(length=48), nullable=False),
        sa.Column("url", sa.String(length=500), nullable=True),
        sa.Column("format", sa.String(length=8), nullable=False),
        sa.Column("on", sa.String(length=8), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("posts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("tried_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("sent_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("done", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("last_status", sa.Integer(), nullable=True),
        sa.Column("result", sa.String(length=200), nullable=True),
        sa.ForeignKeyConstraint(
            ["gate_id"],
            ["gates.id"],
            name=op.f("fk_alert_deliveries_gate_id_gates"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_deliveries")),
        sa.UniqueConstraint("gate_id", "target", name=op.f("uq_alert_deliveries_gate_id")),
    )
    op.create_index(
        op.f("ix_alert_deliveries_gate_id"), "alert_deliveries", ["gate_id"], unique=False
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_alert_deliveries_gate_id"), table_name="alert_deliveries")
    op.drop_table("alert_deliveries")
