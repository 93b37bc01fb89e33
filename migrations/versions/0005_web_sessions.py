"""web sessions: the pages' sign-in, hashed secret, token, scopes, CSRF token, expiry

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "web_sessions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("secret_hash", sa.String(length=64), nullable=False),
        sa.Column("token_id", sa.Integer(), nullable=False),
        sa.Column("scopes", sa.String(length=100), nullable=False),
        sa.Column("csrf_token", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["token_id"],
            ["api_tokens.id"],
            name=op.f("fk_web_sessions_token_id_api_tokens"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_web_sessions")),
        sa.UniqueConstraint("secret_hash", name=op.f("uq_web_sessions_secret_hash")),
    )
    with op.batch_alter_table("web_sessions") as batch:
        batch.create_index(batch.f("ix_web_sessions_token_id"), ["token_id"], unique=False)
        batch.create_index(batch.f("ix_web_sessions_expires_at"), ["expires_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("web_sessions") as batch:
        batch.drop_index(batch.f("ix_web_sessions_expires_at"))
        batch.drop_index(batch.f("ix_web_sessions_token_id"))
    op.drop_table("web_sessions")
