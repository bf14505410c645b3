import sys

from pilot.pilotctl.cli import main

sys.exit(main())
