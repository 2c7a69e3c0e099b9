"""The engine's child process: `python -m mlx_spec._child READ_FD WRITE_FD` (see service.py)."""

import sys
from multiprocessing.connection import Connection

if __name__ == "__main__":
    from mlx_spec.service import serve

    serve(Connection(int(sys.argv[1]), writable=False), Connection(int(sys.argv[2]),
                                                                    readable=False))
