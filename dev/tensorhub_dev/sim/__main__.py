import sys

from tensorhub_dev.sim.cli import main

sys.exit(main())
