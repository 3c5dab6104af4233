"""`python -m engine.cli`: the same as the `evopool` command."""
import sys

from engine.cli.main import main

sys.exit(main())
