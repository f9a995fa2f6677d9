import sys

from tensorhub_verl.netlab.cli import main

sys.exit(main())
