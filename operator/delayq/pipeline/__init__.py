"""Batch jobs on Spark: bulk ingest into a topic, journal archive to Parquet, delivery audit.

Pure DataFrame transforms (`transforms`, `audit`) are kept apart from I/O (`io_redis`, `ingest`,
`archive`) so the rules are unit-tested on small frames and the jobs run unchanged on a cluster.
"""
