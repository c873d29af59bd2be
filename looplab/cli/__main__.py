"""`python -m looplab.cli`: the `looplab` command from this checkout."""

from looplab.cli import main

raise SystemExit(main())
