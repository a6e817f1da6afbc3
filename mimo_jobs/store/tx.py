"""Transactions on a store connection: every write that touches more than one row runs in one, so a failure
leaves nothing half-written. Its own module so that the schema's migrations and the connection both use it
without importing each other."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def transaction(con) -> Iterator:
    con.execute("BEGIN TRANSACTION")
    try:
        yield con
    except BaseException:
        con.execute("ROLLBACK")
        raise
    else:
        con.execute("COMMIT")
