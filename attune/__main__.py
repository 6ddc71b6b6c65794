import sys

from attune.app.cli import main

sys.exit(main())
