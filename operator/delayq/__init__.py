"""delayq: a delay queue that delivers each message at its instant, never early, never lost."""

__version__ = "0.1.0"
