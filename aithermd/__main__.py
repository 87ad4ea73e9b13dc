from aithermd.cli import main

raise SystemExit(main())
