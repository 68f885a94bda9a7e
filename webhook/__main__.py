"""``python -m volcano_job_webhook``: the same commands as ``volcano-webhook``."""

import sys

from volcano_job_webhook.cli import main

sys.exit(main())
