"""Stand-in package for tests/test_bundle.py."""
