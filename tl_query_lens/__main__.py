import sys

from tl_query_lens.cli import main

sys.exit(main())
