import sys

from tensorhub_dev.netlab.cli import main

sys.exit(main())
