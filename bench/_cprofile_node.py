"""Run a node command under cProfile timed by CPU time (`time.process_time`), so that a
node descheduled on a loaded machine shows where its CPU went, not where it waited; dump
the stats on exit (SystemExit included). Used by `bench/_phalanx.py` (`--cprofile`).

    python bench/_cprofile_node.py OUT.prof -m phalanx node run CONFIG
    python bench/_cprofile_node.py OUT.prof SCRIPT.py ARGS...
"""

from __future__ import annotations

import cProfile
import runpy
import sys
import time


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit("usage: _cprofile_node.py OUT.prof (-m MODULE | SCRIPT) ARGS...")
    out, rest = sys.argv[1], sys.argv[2:]
    profile = cProfile.Profile(time.process_time)
    try:
        if rest[0] == "-m":
            sys.argv = [rest[1], *rest[2:]]
            profile.runcall(runpy.run_module, rest[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = rest
            profile.runcall(runpy.run_path, rest[0], run_name="__main__")
    except SystemExit:
        pass
    finally:
        profile.dump_stats(out)


if __name__ == "__main__":
    main()
