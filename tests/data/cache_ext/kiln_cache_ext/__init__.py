"""Compiler-cache test extension."""
