#!/usr/bin/env bash
# A local walk-through: the kubelet simulator and the agent on the fake backend, in a scratch directory.
# Watch registration, the device list and a sample allocation; Ctrl-C stops both, removes the scratch
# directory and exits 0 (Ctrl-C is how the walk-through ends).
set -euo pipefail
if [ -t 0 ] && [ -z "${ASCEND_AGENT_RUN_JOB:-}" ]; then
    # On a terminal, run as a job of its own that the terminal signals alone: Ctrl-C then reaches this
    # walk-through and not what started it (make would die of it and report "Interrupt", a tee of its
    # output would die before the last lines). bash's job control takes its terminal from stderr: with
    # stderr in a pipe (make run 2>&1 | tee log) the job never got the terminal, Ctrl-C ended make and
    # this script but not the job, and the agent and kubelet-sim ran on. So stderr is stdin's terminal
    # while the job starts, and the job gets its own stderr back.
    exec 3>&2 2<&0
    set -m
    ASCEND_AGENT_RUN_JOB=1 "$0" "$@" 2>&3 3>&-
    exit
fi
dir=$(mktemp -d /tmp/ascend-agent-run.XXXXXX)
cleanup() {
    kill ${sim:-} ${agent:-} 2>/dev/null || true
    wait 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 0' INT TERM
ascend-agent kubelet-sim --kubelet-dir "$dir" --allocate 2 &
sim=$!
# The simulator needs an explicit directory and refuses one where a kubelet.sock already exists.
while [ ! -S "$dir/kubelet.sock" ]; do kill -0 "$sim" 2>/dev/null || exit 1; sleep 0.1; done
ascend-agent run --backend fake --kubelet-dir "$dir" --plugin-dir "$dir/agent" --metrics-address "" "$@" &
agent=$!
wait "$agent"
