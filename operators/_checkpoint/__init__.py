"""A query's checkpoint beside the state store: the runner's journal, where
a query's state lives, and reading state offline."""
