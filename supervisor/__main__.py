import sys

from trainwarden.supervisor.cli.main import main

sys.exit(main())
