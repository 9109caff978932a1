"""``python -m fedsim.report``: see :mod:`fedsim.report`."""

import sys

from fedsim.report.command import main

sys.exit(main())
