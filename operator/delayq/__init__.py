"""delayq: a delay queue that delivers each message at its instant, never early, never lost."""

# The one place the version is written: pyproject reads it (setuptools dynamic version), the
# operator's default image tag is built from it, and a test holds charts/delayq/Chart.yaml to it.
__version__ = "0.3.0"
