"""A stand-in for the npu-smi executable, controlled through files next to it (read on every run, so a
running agent sees changes at once): ``mode`` (ok, fail, hang, garbage, flood: prints zeros without end,
orphan: a child that holds the output open outlives it) and ``out/<args>.txt``."""

import os
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
args = " ".join(sys.argv[1:])
with open(os.path.join(here, "calls.log"), "a") as log:
    log.write(args + "\n")
with open(os.path.join(here, "mode")) as handle:
    mode = handle.read().strip()
if mode == "hang":
    time.sleep(3600)
elif mode == "flood":
    zeros = bytes(1 << 16)
    while True:
        sys.stdout.buffer.write(zeros)
elif mode == "orphan":
    import subprocess

    child = subprocess.Popen(["sleep", "3600"])  # keeps our stdout and stderr open
    with open(os.path.join(here, "orphan.pid"), "w") as pid_file:
        pid_file.write(str(child.pid))
    time.sleep(3600)
elif mode == "fail":
    sys.stderr.write("dcmi module initialize failed. ret is -8005\n")
    sys.exit(1)
elif mode == "garbage":
    sys.stdout.write("\x1b[31m?? npu-smi \x00 segmentation fault\n|| | ||\n+=+\n")
    sys.exit(0)
path = os.path.join(here, "out", args.replace(" ", "_") + ".txt")
if not os.path.exists(path):
    sys.stderr.write(f"Usage: npu-smi info [-l | -m | -t <type> -i <id>]; no output for '{args}'\n")
    sys.exit(2)
with open(path, encoding="utf-8") as handle:
    sys.stdout.write(handle.read())
