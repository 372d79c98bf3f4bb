import sys

from rampwatch.drivers.sim.serve import main

sys.exit(main())
