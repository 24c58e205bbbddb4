"""`python -m rocm_zoo.cli`, as the `rocm-zoo` script."""

import sys

from rocm_zoo.cli import main

sys.exit(main())
