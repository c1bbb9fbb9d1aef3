"""Run ``stoker pack`` in a child process with slowed-down checks (for kill/signal tests).

Usage: python pack_driver.py [stoker pack arguments...]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

if __name__ == "__main__":
    import packhelp

    import stoker.pack.plan.options as options
    from stoker.cli import main

    options.check_image = packhelp.slow_check  # what PackOptions' check=None stands for
    sys.exit(main(["pack", *sys.argv[1:]]))
