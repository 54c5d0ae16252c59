"""The tree-writer stand-in's package (tests/data/tree_writers): a tracked file the wheel carries."""

X = 1
