import sys

from pilot.agent.cli import main

sys.exit(main())
