from basal.cli import main

raise SystemExit(main())
