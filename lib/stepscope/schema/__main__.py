"""`python -m stepscope.schema [docs/artifacts.md]`: regenerate the artifact docs."""

import sys

from stepscope.schema.docs import update

update(sys.argv[1] if len(sys.argv) > 1 else "docs/artifacts.md")
