import sys

from grassflow.cli import main

sys.exit(main())
