"""Runnable example workflows."""
