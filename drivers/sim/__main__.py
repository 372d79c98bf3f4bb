import sys

from drivers.sim.serve import main

sys.exit(main())
