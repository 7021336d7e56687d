"""The delay service (`delayq serve`): delivery by topic type, the HTTP API, metrics and logs."""
