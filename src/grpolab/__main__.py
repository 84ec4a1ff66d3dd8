"""`python -m grpolab ...` (and `torchrun -m grpolab ...`): the same command line as `grpolab`."""

import sys

from grpolab.app.cli import main

sys.exit(main())
