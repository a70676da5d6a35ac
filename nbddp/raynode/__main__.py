"""``python -m nbddp.raynode CONFIG.json``: the Ray driver of one launch (nbddp/raynode/driver.py)."""
import sys

from nbddp.raynode.driver import main

sys.exit(main(sys.argv[1]))
