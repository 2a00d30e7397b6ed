#!/bin/sh
# Runs inside the built image (POSIX sh: the image has no bash of its own to rely on). The kubelet simulator
# and the agent on the fake backend, both from the image's own ascend-agent: passes when the agent logs its
# registration and the simulator prints the device list it received, then stops both with SIGTERM and
# expects exit status 0 from each.
set -eu

dir=$(mktemp -d /tmp/image-test.XXXXXX)
sim_log=$dir/kubelet-sim.log
agent_log=$dir/agent.log
: >"$sim_log"
: >"$agent_log"
trap 'rm -rf "$dir"' EXIT
sim=
agent=

show_logs() {
    echo "--- kubelet-sim"
    cat "$sim_log"
    echo "--- agent"
    cat "$agent_log"
}

fail() {
    echo "in-image: $1" >&2
    show_logs >&2
    kill -TERM $sim $agent 2>/dev/null || true
    exit 1
}

# await FILE TEXT: until FILE holds TEXT, for at most AWAIT_SECONDS (30 by default; longer where the image runs
# emulated), since the image has no inotify tool to wait with; fails at once when the agent or the simulator
# has exited.
await() {
    tries=0
    until grep -qF -- "$2" "$1"; do
        for pid in $sim $agent; do
            kill -0 "$pid" 2>/dev/null || fail "$(name_of "$pid") exited while waiting for '$2'"
        done
        tries=$((tries + 1))
        [ "$tries" -le "$((${AWAIT_SECONDS:-30} * 10))" ] || fail "no '$2' within ${AWAIT_SECONDS:-30} s"
        sleep 0.1
    done
}

name_of() {
    if [ "$1" = "$sim" ]; then echo "kubelet-sim"; else echo "the agent"; fi
}

mkdir "$dir/kubelet"  # the simulator makes no directory
ascend-agent kubelet-sim --kubelet-dir "$dir/kubelet" >"$sim_log" 2>&1 &
sim=$!
await "$sim_log" "listening on"

started=$(date +%s.%N)
ascend-agent run --backend fake --kubelet-dir "$dir/kubelet" --plugin-dir "$dir/agent" --metrics-address "" >"$agent_log" 2>&1 &
agent=$!
await "$agent_log" "Registered resource huawei.com/Ascend910"
echo "in-image: start -> registered in $(awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }') s (this poll's 0.1 s steps included)"
await "$sim_log" "ListAndWatch huawei.com/Ascend910: 8 devices, 8 healthy"
await "$sim_log" "Allocate Ascend910-"

# The command line has handed over to the runner, with -OO, and the runner's modules (the standard library's
# too: the official python base ships none) load from bytecode rather than being compiled at every start.
tr '\0' ' ' <"/proc/$agent/cmdline" | grep -q -- "-X no_debug_ranges -OO -m ascend_agent.runner" ||
    fail "the agent is not the runner with -X no_debug_ranges and -OO: $(tr '\0' ' ' <"/proc/$agent/cmdline")"
# The interpreter's path: the first word, or under emulation the first after qemu's binfmt wrapper.
runner_python=$(tr '\0' '\n' <"/proc/$agent/cmdline" | grep -m 1 -E '/python[0-9.]*$')
uncompiled=$("$runner_python" -OO -c '
import importlib.util, sys
import ascend_agent.process, anyio._backends._asyncio
for name, module in sorted(sys.modules.items()):
    source = getattr(module, "__file__", None) or ""
    if source.endswith(".py"):
        cached = importlib.util.cache_from_source(source, optimization=2)
        try:
            open(cached, "rb").close()
        except OSError:
            print(name)
')
[ -z "$uncompiled" ] || fail "modules the runner would compile at every start: $(echo $uncompiled)"
echo "in-image: the runner's resident memory after registration: $(grep VmRSS "/proc/$agent/status")"

status=0
kill -TERM "$agent"
wait "$agent" || status=$?
agent=
[ "$status" -eq 0 ] || fail "the agent exited with status $status after SIGTERM"
kill -TERM "$sim"
wait "$sim" || status=$?
sim=
[ "$status" -eq 0 ] || fail "kubelet-sim exited with status $status after SIGTERM"

listed=$(grep -cE '^kubelet-sim: +Ascend910-[0-7] +Healthy' "$sim_log") || true
[ "$listed" -eq 8 ] || fail "kubelet-sim printed $listed of the 8 devices as Healthy"
show_logs
echo "in-image: registered, 8 devices listed and allocated from, both stopped with status 0"
