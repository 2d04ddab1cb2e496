"""`python -m stepscope.schema [README.md [docs/artifacts.md]]`: regenerate the artifact docs."""

import sys

from stepscope.schema.docs import update

args = sys.argv[1:]
update(args[0] if args else "README.md", args[1] if len(args) > 1 else "docs/artifacts.md")
