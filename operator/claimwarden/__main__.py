from claimwarden.cli import main

raise SystemExit(main())
