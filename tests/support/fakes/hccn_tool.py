"""A stand-in for the hccn_tool executable, controlled through files next to it (read on every run): ``mode``
(ok, fail, hang, garbage), ``out/<args>.txt`` (printed, exit status 0) and ``err/<args>.txt`` (printed on
stderr, exit status from ``err/<args>.status``, 1 without one). Arguments without an answer: a healthy
network for ``-link -g`` and ``-net_health -g``, else what hccn_tool prints for a chip with no address, exit
status 13."""

import os
import sys

from lifetime import hang

here = os.path.dirname(os.path.realpath(__file__))
args = " ".join(sys.argv[1:])
try:
    with open(os.path.join(here, "calls.log"), "a") as log:
        log.write(args + "\n")
except OSError:  # run where its directory is mounted read-only (inside the agent's container)
    pass
with open(os.path.join(here, "mode")) as handle:
    mode = handle.read().strip()
if mode == "hang":
    hang()
elif mode == "fail":
    sys.stderr.write("dsmi_get_device_ip_address failed, ret = -8005\n")
    sys.exit(1)
elif mode == "garbage":
    sys.stdout.write("\x1b[31m?? hccn_tool \x00 ipaddr:not-an-address\nsegmentation fault\n")
    sys.exit(0)
name = args.replace(" ", "_") + ".txt"
error = os.path.join(here, "err", name)
if os.path.exists(error):
    with open(error, encoding="utf-8") as handle:
        sys.stderr.write(handle.read())
    status = os.path.join(here, "err", name[: -len(".txt")] + ".status")
    if not os.path.exists(status):
        sys.exit(1)
    with open(status) as handle:
        sys.exit(int(handle.read()))
path = os.path.join(here, "out", name)
healthy = {"-link -g": "link status: UP\n", "-net_health -g": "net health status: Success\n"}
command = " ".join(sys.argv[3:])
if not os.path.exists(path) and command in healthy:
    sys.stdout.write(healthy[command])
    sys.exit(0)
if not os.path.exists(path):
    sys.stderr.write("Get ipconf failed, because no ip was preset there!\n")
    sys.exit(13)
with open(path, encoding="utf-8") as handle:
    sys.stdout.write(handle.read())
