import sys

from tests.conformance.runner import main

sys.exit(main())
