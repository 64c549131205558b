"""Constraints the pool's models declare beyond Django's own."""

from __future__ import annotations

from django.db import models


class CoveringUniqueConstraint(models.UniqueConstraint):
    """A unique constraint whose index also carries ``include`` columns where the database
    supports covering indexes (PostgreSQL), and a plain unique constraint elsewhere (SQLite).

    Django's own UniqueConstraint creates no constraint at all on a database without covering
    indexes (its warning models.W039), so the uniqueness would be lost there; this one keeps
    it on every database, and only the covering part depends on the database. Where one index
    can be both a key and a covering index (Step: the step order and the curation columns),
    every written row costs one index entry instead of two.
    """

    def _on(self, schema_editor) -> models.UniqueConstraint:
        if schema_editor.connection.features.supports_covering_indexes:
            return self
        return models.UniqueConstraint(fields=self.fields, name=self.name)

    def constraint_sql(self, model, schema_editor):
        on = self._on(schema_editor)
        return (
            super().constraint_sql(model, schema_editor)
            if on is self
            else on.constraint_sql(model, schema_editor)
        )

    def create_sql(self, model, schema_editor):
        on = self._on(schema_editor)
        return super().create_sql(model, schema_editor) if on is self else on.create_sql(model, schema_editor)

    def remove_sql(self, model, schema_editor):
        on = self._on(schema_editor)
        return super().remove_sql(model, schema_editor) if on is self else on.remove_sql(model, schema_editor)

    def _check(self, model, connection):
        # Without covering indexes the constraint is still created (plain): no W039.
        return [e for e in super()._check(model, connection) if e.id != "models.W039"]
