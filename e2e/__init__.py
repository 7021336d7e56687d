"""End-to-end tests against a real Kubernetes control plane (see docs/e2e.md).

A package, so that the harness is imported as ``e2e.harness`` and never collides with helper
modules of the unit and integration tiers in ``tests/``.
"""
