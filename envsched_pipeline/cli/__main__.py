import sys

from envsched_pipeline.cli import main

sys.exit(main())
