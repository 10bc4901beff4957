from fluxmq.daemon import main

raise SystemExit(main())
