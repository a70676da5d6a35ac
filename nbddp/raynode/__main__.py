"""``python -m nbddp.raynode CONFIG.json``: the Ray driver of one launch (nbddp/raynode/driver.py)."""
import sys

if __name__ == "__main__":
    from nbddp.raynode.driver import main

    sys.exit(main(sys.argv[1]))
