"""``python -m mechlingo`` = the ``mechlingo`` command."""

import sys

from mechlingo.cli import main

sys.exit(main())
