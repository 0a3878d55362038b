import sys

from softdta.cli.app import main

sys.exit(main())
