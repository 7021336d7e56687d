"""s3a:// paths of `delayq pipeline backup | restore`: an S3-compatible store behind Spark's S3A.

Spark writes and reads the backup there itself (the same Parquet, the same `errorifexists`
write and `_SUCCESS` marker as on a volume), through Hadoop's S3A filesystem; its jars
(hadoop-aws and the AWS SDK v2 modules it needs) come with the Spark configuration
(`spark.jars`, see scripts/install-s3a-jars.sh, or `spark.jars.packages`).

Settings come from the standard AWS environment of the process that runs the job, read when it
starts: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN) as S3A's own keys on
the session's Hadoop configuration, which Spark hands to every task (an executor on a cluster
needs no variables of its own; the JVM's environment, fixed when it started, would not follow a
session reused in-process); none set: S3A's own provider chain (instance or pod roles). The
endpoint of an S3-compatible store: `--s3-endpoint`, else the AWS SDKs' AWS_ENDPOINT_URL_S3 or
AWS_ENDPOINT_URL, with path-style access (a bucket is a path on the endpoint, no per-bucket DNS
name) and a region (AWS_REGION, else us-east-1, which such stores accept). Spark redacts these
keys where it shows its configuration (`spark.redaction.regex`: secret, token, access.key). The
path is checked from the driver before the job starts, so a wrong credential or endpoint is one
line naming the path, any secret of the environment masked in it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

SCHEME = "s3a"
ENDPOINT_ENV = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")  # as the AWS SDKs and CLI read them
REGION_ENV = ("AWS_REGION", "AWS_DEFAULT_REGION")
DEFAULT_REGION = "us-east-1"
#: The credential variables and the S3A keys they set (the token: temporary credentials).
CREDENTIAL_ENV = {
    "AWS_ACCESS_KEY_ID": "fs.s3a.access.key",
    "AWS_SECRET_ACCESS_KEY": "fs.s3a.secret.key",
    "AWS_SESSION_TOKEN": "fs.s3a.session.token",
}
SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
MISSING_JARS = "No FileSystem for scheme"  # Hadoop's UnsupportedFileSystemException


class StoreError(Exception):
    """An s3a:// path the job cannot use (unreachable, refused, present or absent): one line."""


def is_s3a(path: str) -> bool:
    return urlsplit(path).scheme == SCHEME


def s3a_settings(endpoint: str | None, environ: Mapping[str, str]) -> dict[str, str]:
    """The Hadoop settings S3A gets: the credentials the environment holds, and for an
    S3-compatible store (an endpoint given) the endpoint, path-style access and a region; for
    AWS itself S3A's defaults apply."""
    settings = {key: environ[name] for name, key in CREDENTIAL_ENV.items() if environ.get(name)}
    endpoint = endpoint or next((environ[name] for name in ENDPOINT_ENV if environ.get(name)), "")
    if endpoint:
        region = next((environ[name] for name in REGION_ENV if environ.get(name)), DEFAULT_REGION)
        settings["fs.s3a.endpoint"] = endpoint
        settings["fs.s3a.endpoint.region"] = region
        settings["fs.s3a.path.style.access"] = "true"
    return settings


def masked(text: str, environ: Mapping[str, str]) -> str:
    """`text` with the value of every secret variable of the environment replaced by ***."""
    for name in SECRET_ENV:
        if secret := environ.get(name):
            text = text.replace(secret, "***")
    return text


def configure(spark: Any, settings: Mapping[str, str]) -> None:
    """Set the S3A settings on the session's Hadoop configuration, which every read and write
    of the session (and its executors' tasks) starts from."""
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    for key, value in settings.items():
        hadoop.set(key, value)


def check(
    spark: Any, path: str, option: str, parts: tuple[str, ...], environ: Mapping[str, str]
) -> None:
    """From the driver: with `parts` empty, `path` must not exist (a new backup); else each
    of `parts` must exist under it (a backup to read). Raises StoreError, one line naming the
    option and path: the store unreachable, the credentials refused, the jars missing, the
    backup absent; ConfigError for a backup's path that exists."""
    from py4j.protocol import Py4JJavaError

    from delayq.service.config import ConfigError

    jvm = spark.sparkContext._jvm
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    filesystem = None
    try:  # a new instance, closed after: the cached one may hold other credentials
        fs = jvm.org.apache.hadoop.fs
        root = fs.Path(path)
        filesystem = fs.FileSystem.newInstance(root.toUri(), hadoop)
        missing = [p for p in parts if not filesystem.exists(fs.Path(f"{path}/{p}"))]
        present = not parts and filesystem.exists(root)
    except Py4JJavaError as error:
        raise StoreError(f"cannot use {option} {path}: {_reason(error, environ)}") from None
    finally:
        if filesystem is not None:
            filesystem.close()
    if present:  # as a local --output that exists: a configuration error (exit code 2)
        raise ConfigError(f"{option} {path} exists: give a new path for the backup")
    if missing:
        raise StoreError(f"cannot read {option} {path}: no backup there (no {missing[0]}/)")


def _reason(error: Any, environ: Mapping[str, str]) -> str:
    """The Java exception's first line, masked; where the S3A jars are missing, what to add."""
    java = error.java_exception
    text = str(java.getMessage() or java.getClass().getName())
    if MISSING_JARS in text:
        return (
            f"{text.splitlines()[0]}: Spark needs the S3A jars (spark.jars from "
            "scripts/install-s3a-jars.sh, or spark.jars.packages org.apache.hadoop:hadoop-aws)"
        )
    return masked(text.strip().splitlines()[0], environ)
