"""``python -m bench [--only NAME] [--quick]``: run the benchmarks (see bench/harness.py)."""

from bench.harness import main

raise SystemExit(main())
