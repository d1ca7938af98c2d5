"""The foreign-key table join: its description, its two stages, and how they
are wired into a pipeline (docs/operators/fk-join.md)."""
