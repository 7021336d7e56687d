"""Handler bodies only, one module per event: `reconcile` (kopf's create/update/resume) and
`health.refresh` (the leader's periodic health pass); operator.py registers them, and the
helpers they share live beside this package in kube/ (apply, context, errors, topics)."""
