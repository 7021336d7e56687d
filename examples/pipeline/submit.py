"""The driver file `spark-submit` runs: `spark-submit [options] submit.py pipeline ingest ...`.

spark-submit needs a Python *file*; running `delayq/cli.py` itself would put the package
directory first on `sys.path`, where `delayq/queue` shadows the standard library's `queue`.
This file lives outside the package and only calls the `delayq` entry point, so the master,
`--conf` settings and `spark-defaults.conf` are spark-submit's (see docs/pipeline.md).
"""

import sys

from delayq.cli import main

if __name__ == "__main__":
    sys.exit(main())
