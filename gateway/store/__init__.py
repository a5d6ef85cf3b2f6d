"""The durable state: one connection (SQLite or PostgreSQL), the journal and outbox, and the tables of
access, approvals, leases and schedules, their schema and retention."""
