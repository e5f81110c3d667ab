import sys

from grassflow.bench import main
from grassflow.job import run

sys.exit(run(main))
