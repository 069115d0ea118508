"""``python -m mechlingo.cli`` = the ``mechlingo`` command."""

import sys

from mechlingo.cli.main import main

sys.exit(main())
