import sys

from attune.cli import main

sys.exit(main())
