import sys

from trainwarden.trainer.cli import main

sys.exit(main())
