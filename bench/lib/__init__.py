"""What every scenario shares: the /proc reader, the server, the load client, profiles, the
conditions line and `--against` (harness.py puts them behind one command line)."""
