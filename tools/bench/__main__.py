"""``python -m tools.bench``: the benchmark harness (``tools.bench.run``)."""

from tools.bench.run import main

raise SystemExit(main())
