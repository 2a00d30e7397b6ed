"""A stand-in for the npu-smi executable, controlled through files next to it (read on every run, so a
running agent sees changes at once): ``mode`` (ok, fail, hang, garbage, flood: prints zeros without end,
orphan: a child that holds the output open outlives it), ``out/<args>.txt`` (printed), ``err/<args>.txt``
(printed on stderr, exit status 1) and ``vnpu.json``, the chips' vNPUs, which makes it answer
``info -t info-vnpu``, ``set -t create-vnpu`` and ``set -t destroy-vnpu`` as a node would, device nodes
``vdavinci<id>`` included; ``reset.json`` makes it answer ``set -t reset`` as a node would: its confirmation
prompts on stdout, the answers read from stdin and logged to ``resets.log``, then ``result`` ok (the files of
``after`` become its answers, e.g. a healthy table: the chip comes back), fail, unsupported or hang."""

import json
import os
import sys

from lifetime import HANG_LIMIT, hang

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
elif mode == "flood":
    zeros = bytes(1 << 16)
    while True:
        sys.stdout.buffer.write(zeros)
elif mode == "orphan":
    import subprocess

    child = subprocess.Popen(["sleep", str(HANG_LIMIT)])  # keeps our stdout and stderr open
    with open(os.path.join(here, "orphan.pid"), "w") as pid_file:
        pid_file.write(str(child.pid))
    hang()
elif mode == "fail":
    sys.stderr.write("dcmi module initialize failed. ret is -8005\n")
    sys.exit(1)
elif mode == "garbage":
    sys.stdout.write("\x1b[31m?? npu-smi \x00 segmentation fault\n|| | ||\n+=+\n")
    sys.exit(0)
name = args.replace(" ", "_") + ".txt"
error = os.path.join(here, "err", name)
if os.path.exists(error):
    with open(error, encoding="utf-8") as handle:
        sys.stderr.write(handle.read())
    sys.exit(1)

BORDER = "+" + "-" * 79 + "+"


def row(text):
    return "| " + text.ljust(78) + "|"


def option(flag):
    words = sys.argv[1:]
    return words[words.index(flag) + 1] if flag in words else None


def render(chip, templates):
    used = [templates[v["template"]] for v in chip["vnpus"]]
    aicore = chip["aicore"] - sum(t[0] for t in used)
    memory = chip["memory"] - sum(t[1] for t in used)
    aicpu = chip["aicpu"] - sum(t[2] for t in used)
    lines = [
        BORDER,
        row("NPU resource static info as follow:"),
        row("Format:Free/Total                   NA: Currently, query is not supported."),
        row("AICORE    Memory    AICPU    VPC    VENC    VDEC    JPEGD    JPEGE    PNGD"),
        row("           GB"),
        "|" + "=" * 79 + "|",
        row(
            f"{aicore}/{chip['aicore']}".ljust(10)
            + f"{memory}/{chip['memory']}".ljust(10)
            + f"{aicpu}/{chip['aicpu']}".ljust(9)
            + "NA/NA  NA/NA   NA/NA   NA/NA    NA/NA    NA/NA"
        ),
        BORDER,
        row(f"Total number of vnpu: {len(chip['vnpus'])}"),
        BORDER,
    ]
    if chip["vnpus"]:
        lines += ["|  Vnpu ID  |  Vgroup ID     |  Container ID  |  Status  |  Template Name       |", BORDER]
    for index, vnpu in enumerate(chip["vnpus"]):
        container = vnpu.get("container") or "ffffffffffff"
        status = "1" if vnpu.get("container") else "0"
        lines += [
            f"|  {str(vnpu['id']).ljust(9)}|  {str(index).ljust(14)}|  {container.ljust(14)}|  "
            f"{status.ljust(8)}|  {vnpu['template'].ljust(20)}|",
            BORDER,
        ]
    return "\n".join(lines) + "\n"


def save(state):
    path = os.path.join(here, "vnpu.json")
    with open(path + ".tmp", "w") as handle:
        json.dump(state, handle)
    os.replace(path + ".tmp", path)


def vnpu_command():
    """Answer a vNPU command from vnpu.json; False when it is not one."""
    path = os.path.join(here, "vnpu.json")
    if not os.path.exists(path) or not (args.startswith("info -t info-vnpu") or args.startswith("set -t")):
        return False
    with open(path) as handle:
        state = json.load(handle)
    chip = state["chips"].get(f"{option('-i')}:{option('-c')}")
    if chip is None:
        sys.stderr.write("Error: dcmi get vnpu info failed, ret = -8255 (not support)\n")
        sys.exit(1)
    templates = state["templates"]
    if args.startswith("info"):
        sys.stdout.write(render(chip, templates))
        return True
    if args.startswith("set -t create-vnpu"):
        template = option("-f")
        if state.get("fail_create"):
            sys.stderr.write("Error: create vnpu failed: no free vgroup on this chip\n")
            sys.exit(1)
        if template not in templates or template in state.get("reject", []):
            sys.stdout.write("       Status : FAILED\n       Message : The template is not supported\n")
            sys.exit(1)
        used = sum(templates[v["template"]][0] for v in chip["vnpus"])
        cpus = sum(templates[v["template"]][2] for v in chip["vnpus"])
        if used + templates[template][0] > chip["aicore"] or cpus + templates[template][2] > chip["aicpu"]:
            sys.stdout.write("       Status : FAILED\n       Message : Not enough resources\n")
            sys.exit(1)
        taken = {v["id"] for other in state["chips"].values() for v in other["vnpus"]}
        asked = option("-v")
        if asked is not None and int(asked) in taken:
            sys.stdout.write(f"       Status : FAILED\n       Message : vnpu id {asked} is in use\n")
            sys.exit(1)
        first = chip["phys"] * 16 + 100
        vnpu_id = (
            int(asked) if asked is not None else next(i for i in range(first, first + 16) if i not in taken)
        )
        chip["vnpus"].append({"id": vnpu_id, "template": template})
        save(state)
        open(os.path.join(state["dev"], f"vdavinci{vnpu_id}"), "w").close()
        if state.get("hang_after_create"):  # made, but the answer never comes
            hang()
        sys.stdout.write("       Status : OK\n       Message : Create vnpu success\n")
        return True
    if args.startswith("set -t destroy-vnpu"):
        vnpu_id = int(option("-v"))
        kept = [v for v in chip["vnpus"] if v["id"] != vnpu_id]
        if len(kept) == len(chip["vnpus"]):
            sys.stdout.write(f"       Status : FAILED\n       Message : vnpu {vnpu_id} does not exist\n")
            sys.exit(1)
        chip["vnpus"] = kept
        save(state)
        os.unlink(os.path.join(state["dev"], f"vdavinci{vnpu_id}"))
        sys.stdout.write(f"       Status : OK\n       Message : Destroy vnpu {vnpu_id} success\n")
        return True
    return False


def reset_command():
    """Answer ``set -t reset`` from reset.json; False when it is not one."""
    path = os.path.join(here, "reset.json")
    if not args.startswith("set -t reset") or not os.path.exists(path):
        return False
    with open(path) as handle:
        plan = json.load(handle)
    if plan["result"] == "unsupported":
        sys.stdout.write("This device does not support setting reset.\n")
        sys.exit(1)
    sys.stdout.write(
        "Resetting the standard PCIe card or NPU chip may cause a system hang or abnormal reset during "
        "service running.\nAre you sure you want to continue resetting?(Y/N)"
    )
    sys.stdout.flush()
    answers = [sys.stdin.readline().strip()]
    if plan.get("second_prompt"):
        sys.stdout.write("It will reboot all devices, do you want to continue reboot? [y/n]")
        sys.stdout.flush()
        answers.append(sys.stdin.readline().strip())
    with open(os.path.join(here, "resets.log"), "a") as log:
        log.write(args + " | " + " ".join(answers) + "\n")
    if any(answer not in ("Y", "y") for answer in answers):
        sys.stdout.write("\tStatus                         : Fail\n")
        sys.stdout.write("\tMessage                        : User aborts reset chip by inband.\n")
        sys.exit(1)
    sys.stdout.write("\tMessage                        : resetting (about 150 seconds) ...\n")
    sys.stdout.flush()
    if plan["result"] == "hang":
        hang()
    if plan["result"] == "fail":
        sys.stdout.write("\tStatus                         : Fail\n")
        sys.stdout.write("\tMessage                        : Failed to reset chip\n")
        sys.exit(1)
    for answered, text in plan.get("after", {}).items():
        target = os.path.join(here, "out", answered.replace(" ", "_") + ".txt")
        with open(target + ".tmp", "w") as handle:
            handle.write(text)
        os.replace(target + ".tmp", target)
    sys.stdout.write("\tStatus                         : OK\n")
    sys.stdout.write("\tMessage                        : Reset chip successfully.\n")
    return True


if vnpu_command() or reset_command():
    sys.exit(0)
path = os.path.join(here, "out", name)
if not os.path.exists(path):
    sys.stderr.write(f"Usage: npu-smi info [-l | -m | -t <type> -i <id>]; no output for '{args}'\n")
    sys.exit(2)
with open(path, encoding="utf-8") as handle:
    sys.stdout.write(handle.read())
