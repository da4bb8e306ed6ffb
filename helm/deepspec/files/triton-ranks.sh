# The Triton worker's PID 1 when it runs more than one rank: starts `mpirun "$@"` and turns the pod's SIGTERM into
# a drain. Kubernetes signals PID 1 only; mpirun would SIGTERM every rank at once and SIGKILL them a few seconds later,
# and trtllm-llmapi-launch runs tritonserver without passing signals on, so neither reaches the servers' own drain
# (--exit-timeout-secs). Here rank 0 (the API and the LLM's leader, shm prefix `prefix0_`) gets SIGTERM first and
# drains; the followers (`--load-model=tensorrt_llm`), whose GPUs rank 0's requests still use, get it once rank 0
# has exited. mpirun then exits with the ranks, and so does this script, with mpirun's status.
set -u

servers() {  # the PIDs of this pod's tritonserver processes whose command line contains $1
  for proc in /proc/[0-9]*; do
    [ "$(cat "$proc/comm" 2>/dev/null)" = tritonserver ] || continue
    tr '\0' ' ' < "$proc/cmdline" 2>/dev/null | grep -q -e "$1" && echo "${proc#/proc/}"
  done
}

drain() {
  for pid in $(servers prefix0_); do kill -TERM "$pid" 2>/dev/null; done
  while [ -n "$(servers prefix0_)" ]; do sleep 1; done
  for pid in $(servers load-model=tensorrt_llm); do kill -TERM "$pid" 2>/dev/null; done
}

trap drain TERM INT
mpirun "$@" &
launcher=$!
wait "$launcher"
status=$?
while kill -0 "$launcher" 2>/dev/null; do  # `wait` returned for the trap: mpirun is still draining the ranks
  wait "$launcher"
  status=$?
done
exit "$status"
