from tfcompile.cli import main

raise SystemExit(main())
