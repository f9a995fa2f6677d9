import sys

from tensorhub_verl.sim.cli import main

sys.exit(main())
