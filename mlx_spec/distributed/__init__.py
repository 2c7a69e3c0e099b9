"""The target over several machines (mlx.distributed): rank 0 runs the app / CLI / server and
the drafter; every other rank holds its part of the target and repeats rank 0's forwards and
cache cuts (link.py). `launch.load_split` starts it all from a hostfile."""
