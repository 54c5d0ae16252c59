"""The hostile tree's package: loot.json (what its setup.py and build dependency found), _loot (what its
compiles could include)."""
