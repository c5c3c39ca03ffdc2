#!/usr/bin/env bash
# GPU check kit: runs the checks that need real hardware on a GPU host, and the same checks on
# the emulator, and prints one table. Checks:
#   quota       two offline processes of one container (as a non-root user when run as root)
#               allocate as much as they can under the shim; the bytes they hold, measured
#               OUTSIDE the shim through NVML, must not exceed the quota
#   torch-quota the host's PyTorch allocates under the shim until it is refused (skipped when
#               torch is absent, as on the emulator)
#   pool-keep   a stream-ordered pool that keeps freed memory (release threshold UINT64_MAX, as
#               PyTorch's cudaMallocAsync backend sets it): 60 % of the quota allocated with
#               cuMemAllocAsync, freed and synchronised stays in the pool (the driver's figure),
#               so cuMemAlloc of 60 % more is refused; after cuMemPoolTrimTo(pool, 0) it fits
#   stack-limit cuCtxSetLimit(CU_LIMIT_STACK_SIZE) raised to about half the quota (stack for
#               every resident thread): NVML must see no more than the shim counts; a raise to
#               about twice the quota is refused
#   capture-mem a graph captured from a stream (cuMemAllocAsync of 60 % of the quota as its
#               memory node, nothing allocated then), 60 % more allocated with cuMemAlloc: the
#               graph's launch is refused before anything is mapped
#   small-allocs 1000 cuMemAlloc of 1 MiB + 4 KiB each under the shim: what the driver charges
#               for them (NVML, outside the shim, against the process's context alone) must not
#               exceed what the shim counts (the bytes asked for) by more than 5 % + 16 MiB; a
#               driver that backs each with whole large pages would make the quota looser
#   throttle    the offline client alone, without and with the shim (monitor running): the shim
#               must slow it toward its target load (its rate once settled, after 4 of 10 s),
#               and the monitor must not evict it for using an idle GPU
#   throttle-cap the same under MPS with the cap a deployed offline job has (40 %): alone on the
#               GPU it must not be held for online pressure (a low SM clock on an idle GPU)
#   exit        Python clients holding a context get Ctrl-C (KeyboardInterrupt) or SIGTERM under
#               MPS while an online neighbour runs: the neighbour must never hang
#   node        MuxFlow's scenario under the node runtime (sysmonitor + mps-manager + the
#               shim): an online client at 50 requests/s on 30 % of the SMs (node), then on
#               the whole GPU (node-full), alone and beside the offline job: online p99 against
#               alone and the offline throughput kept, with the issue's targets
#   recovery    under MPS with mps-manager: an offline client SIGKILLed while its context and
#               kernels live; the online neighbour's slowest request must stay within 1 s
#               (MPS can hang a dead client's neighbours until mps-manager terminates it)
#   server-restart what mps-manager's server restart relies on: `shutdown_server <pid> -f`
#               ends the MPS server a client holds a context on, the control daemon stays,
#               and the next client gets a new server (else the manager falls back to a full
#               reset, whose window lets a relaunched client take the bare GPU)
#   monitor-cpu the running sysmonitor's CPU at 10 ms sampling on this host's NVML, idle GPU
#               (scheduler run time of all its threads, /proc/PID/task/*/schedstat; min and
#               median of 4 windows, beside a loop that only sleeps 10 ms: the host's floor)
#   launch-cost launches/s of tiny kernels (1000 per sync) direct and under the shim (quota
#               and throttle on, under budget), alternated: the shim's added cost per launch
#   nvml-cost   `sysmonitor nvml-cost`: CPU per call of each NVML query the monitor makes on
#               this GPU, and their sum at 10 ms (where monitor-cpu's time goes), back to back
#               and spaced 10 ms apart as the monitor makes them (cold caches), and whole
#               sample ticks timed the monitor's way
#   mps-clients under MPS: clients holding a context are started one by one until the server
#               refuses one; the count against the emulator's limit (48 from SM 7.0)
#   mps-server  under MPS, with the server up: whether NVML lists nvidia-cuda-mps-server as a
#               compute process, its memory, and whether its comm is the one the monitor
#               recognises it by (listed but not recognised: the monitor would take it for
#               online work)
#   fence       under MPS with mps-manager (compute_mode exclusive_process, its default): a
#               process that misses MPS (another pipe directory) must get no context
#               (CUDA_ERROR_DEVICE_UNAVAILABLE) while an MPS client holds the server up; the
#               mode found is put back when the kit ends
#   shm         under MPS: a client with a /dev/shm of its own (a container's default: a
#               mount namespace with a fresh tmpfs there) beside a server that keeps the host's;
#               the emulator refuses it (CUDA_ERROR_MPS_CONNECTION_FAILED, 805), and
#               mps-manager's shm_dir and node-agent's /dev/shm mount rest on that (root)
#   pipe-ro     under MPS: a client whose pipe directory is a read-only bind mount (root): PASS
#               means MPS clients need no write access there, and node-agent's
#               inject.mps_pipe_read_only (a tenant cannot replace the control socket) can be on
# Usage: scripts/gpu-check.sh [--emulated t4|a10|h100 | --real] [--bin-dir DIR] [--quick]
#        [--only CHECK,CHECK...]   (runs only those checks, names checked; the monitor starts,
#                            MPS only when one of them needs it)
#        [--deadline SECS]   (no check starts SECS seconds after the kit did: SKIP rows, "not
#                            reached"; size it to leave the longest check, ~60 s, and cleanup)
#        [--allow-debug]     (real GPU: run on debug builds; their timing rows are not a
#                            release's, and the table says so)
#        [--reset-gpu]       (real GPU: quit any MPS control daemon and set the compute mode
#                            DEFAULT before starting; without it the kit stops when it finds
#                            either, except what an earlier kit run that did not finish left,
#                            which it always resets)
# Every client and MPS control command the kit waits for runs under `timeout`: a check that
# hangs is a FAIL row naming the timeout. SIGTERM/SIGINT (an outer `timeout`) ends the check
# in progress, prints the table so far and cleans up (MPS quit, compute mode put back): give it
# 30 s (`timeout -k 30 ...`). On a real GPU the compute mode found after cleanup is printed.
# Default: --real when `nvidia-smi -L` lists a GPU, else --emulated t4. Binaries come from
# --bin-dir (default .gc/bin as scripts/gpu-check-pack.sh writes it, target/release, else
# target/debug; built with cargo when missing and cargo is there). Debug builds are refused on a
# real GPU without --allow-debug. When the kit runs as root its offline processes run as uid
# 65534: binaries that user cannot read are copied into the scratch directory (mode 755). Exit status: 0 when no check failed. GPU_CHECK_KEEP=1 keeps the scratch
# directory (logs of every process) for a look afterwards. GPU_CHECK_MONITOR_EXTRA adds keys to
# the monitor's config (e.g. '"nvml": { "gpm_every_ms": 1000 }', to price a pace with
# monitor-cpu and nvml-cost); GPU_CHECK_EXIT_RUNS sets the exit check's signals (default 20),
# GPU_CHECK_RECOVERY_RUNS the recovery check's kills (default 1; GPU_CHECK_RECOVERY_NO_SHIM=1 runs
# its offline client without the shim, GPU_CHECK_RECOVERY_TERMINATE_FIRST=1 has MPS
# `terminate_client` it 0.3 s before the SIGKILL, GPU_CHECK_RECOVERY_SIGTERM_FIRST=<ms> ends it
# as the kubelet does: started with --ignore-sigterm and env XCUDA_KILL_GRACE_MS=<ms>, it gets
# SIGTERM, then SIGKILL <ms> later; GPU_CHECK_RECOVERY_DELETION=<ms> ends it as the kubelet ends
# a process behind a PID 1 that does not forward SIGTERM: no signal, the pod's deletion written
# into its termination file as node-agent writes it (XCUDA_TERMINATION_FILE), SIGKILL <ms> later),
# GPU_CHECK_MPS_CLIENTS the most clients mps-clients starts (default 64).
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
top="$(dirname "$here")"
mode="" profile="t4" bin_dir="" quick=0 only="" deadline=0 reset_gpu=0 allow_debug=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --emulated) mode=emu; profile="${2:?--emulated needs a profile}"; shift 2 ;;
        --real) mode=real; shift ;;
        --bin-dir) bin_dir="${2:?}"; shift 2 ;;
        --quick) quick=1; shift ;;
        --only) only="${2:?--only needs a list of checks}"; shift 2 ;;
        --deadline) deadline="${2:?--deadline needs seconds}"; shift 2
            [[ $deadline =~ ^[0-9]+$ ]] || { echo "gpu-check: --deadline takes whole seconds" >&2; exit 2; } ;;
        --reset-gpu) reset_gpu=1; shift ;;
        --allow-debug) allow_debug=1; shift ;;
        -h|--help) sed -n '2,/^set -uo pipefail/{/^#/p}' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "gpu-check: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
if [[ -n "${GPU_CHECK_RECOVERY_SIGTERM_FIRST:-}" && ! $GPU_CHECK_RECOVERY_SIGTERM_FIRST =~ ^[0-9]+$ ]]; then
    echo "gpu-check: GPU_CHECK_RECOVERY_SIGTERM_FIRST takes whole milliseconds (the grace before the SIGKILL)" >&2
    exit 2
fi
if [[ -n "${GPU_CHECK_RECOVERY_DELETION:-}" && ! $GPU_CHECK_RECOVERY_DELETION =~ ^[0-9]+$ ]]; then
    echo "gpu-check: GPU_CHECK_RECOVERY_DELETION takes whole milliseconds (the deletion's grace before the SIGKILL)" >&2
    exit 2
fi
if [[ -n "${GPU_CHECK_RECOVERY_DELETION:-}" && -n "${GPU_CHECK_RECOVERY_SIGTERM_FIRST:-}" ]]; then
    echo "gpu-check: GPU_CHECK_RECOVERY_DELETION and GPU_CHECK_RECOVERY_SIGTERM_FIRST are two ways to end the client: one at a time" >&2
    exit 2
fi
all_checks=(monitor-cpu nvml-cost quota torch-quota pool-keep stack-limit capture-mem small-allocs throttle mps-server
    throttle-cap exit fence shm pipe-ro node recovery server-restart mps-clients launch-cost)
mps_checks=(mps-server throttle-cap exit fence shm pipe-ro node recovery server-restart mps-clients)
if [[ -n $only ]]; then
    for c in ${only//,/ }; do
        [[ " ${all_checks[*]} " == *" $c "* ]] && continue
        echo "gpu-check: --only: no check named '$c'; the checks: ${all_checks[*]}" >&2
        exit 2
    done
fi
if [[ -z "$mode" ]]; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then mode=real; else mode=emu; fi
fi
py="${PYTHON:-python3}"
# A foreground command with a time limit: TERM past $1 seconds, KILL 5 s later (exit status 124
# or 137). --foreground keeps it in the kit's process group, so that a TERM sent to the whole
# group (an outer `timeout`) reaches it at once and the kit's own trap runs.
tmo() { local s=$1; shift; timeout --foreground -k 5 "$s" "$@"; }
timed_out() { [[ ${1:-} == 124 || ${1:-} == 137 ]]; }
mpsctl() { tmo 15 nvidia-cuda-mps-control "$@"; } # reads its command on stdin
gpu_mode() { tmo 20 nvidia-smi --query-gpu=compute_mode --format=csv,noheader -i 0 2>/dev/null | head -1; }
stop_pids() { # TERM, up to 10 s in all for them to end, then KILL; each reaped
    local p end=$(( SECONDS + 10 ))
    [[ $# -gt 0 ]] || return 0
    kill -TERM "$@" 2>/dev/null
    for p in "$@"; do
        while kill -0 "$p" 2>/dev/null && (( SECONDS < end )); do sleep 0.1; done
    done
    kill -KILL "$@" 2>/dev/null
    for p in "$@"; do wait "$p" 2>/dev/null; done
    return 0
}
wait_line() { # up to $3 s for file $1 to hold a line matching $2 (grep -E) while pid $4 runs;
    # 0 once it does, 1 otherwise (the process exited first, or the time ran out)
    local end=$(( SECONDS + $3 ))
    while (( SECONDS < end )); do
        grep -qE "$2" "$1" 2>/dev/null && return 0
        kill -0 "$4" 2>/dev/null || { grep -qE "$2" "$1" 2>/dev/null; return; }
        sleep 0.1
    done
    return 1
}
wait_pid() { # up to $2 s for pid $1 to end; 1 if it still runs
    local end=$(( SECONDS + $2 ))
    while kill -0 "$1" 2>/dev/null; do (( SECONDS < end )) || return 1; sleep 0.1; done
}
mps_daemons() { # "pid pipe-dir" of each MPS control daemon on this host (its environment says
    # the pipe directory, /tmp/nvidia-mps when unset; readable as root)
    local p a d
    for p in /proc/[0-9]*; do
        a=$(tr '\0' '\n' 2>/dev/null <"$p/cmdline") || continue
        [[ $(head -n 1 <<<"$a") == *nvidia-cuda-mps-control ]] && grep -qx -- '-d' <<<"$a" || continue
        d=$(tr '\0' '\n' 2>/dev/null <"$p/environ" | sed -n 's/^CUDA_MPS_PIPE_DIRECTORY=//p' | head -n 1)
        echo "${p#/proc/} ${d:-/tmp/nvidia-mps}"
    done
}
stale_kit_dirs() { # scratch directories of kit runs that ended without their cleanup
    local s
    for s in "${TMPDIR:-/tmp}"/gpu-check.* /tmp/gpu-check.*; do
        [[ -d $s/mps-pipe ]] || continue
        [[ -r $s/kit.pid ]] && kill -0 "$(cat "$s/kit.pid" 2>/dev/null)" 2>/dev/null && continue
        echo "$s"
    done | sort -u
}
reset_gpu_state() { # a real GPU, before the kit starts anything: what an earlier run left
    local pid dir m stale others=() found=""
    stale=$(stale_kit_dirs)
    while read -r pid dir; do
        [[ -n $pid ]] || continue
        if grep -qxF "${dir%/mps-pipe}" <<<"$stale" || (( reset_gpu )); then
            echo "gpu-check: RESET: quitting MPS control daemon $pid (pipe dir $dir)$(grep -qxF "${dir%/mps-pipe}" <<<"$stale" && echo ", left by a kit run that did not finish")" >&2
            echo quit | CUDA_MPS_PIPE_DIRECTORY="$dir" mpsctl >/dev/null 2>&1
            if ! wait_pid "$pid" 10; then
                echo "gpu-check: RESET: daemon $pid did not quit in 10 s: SIGKILL" >&2
                kill -KILL "$pid" 2>/dev/null; sleep 1
            fi
        else
            others+=("pid $pid, pipe dir $dir")
        fi
    done < <(mps_daemons)
    if (( ${#others[@]} )); then
        echo "gpu-check: an MPS control daemon runs on this host (${others[*]}): the kit would start its own beside it; quit it first (echo quit | CUDA_MPS_PIPE_DIRECTORY=DIR nvidia-cuda-mps-control), or pass --reset-gpu" >&2
        exit 2
    fi
    m=$(gpu_mode)
    [[ -z $m || $m == Default ]] && return 0
    # The mode an unfinished kit run's mps-manager found before it set EXCLUSIVE_PROCESS.
    for dir in $stale; do
        tr -d '\n' <"$dir/run/mps-manager.json" 2>/dev/null | grep -q '"compute_mode": *"exclusive_process"' && found=$dir
    done
    if [[ -n $found ]] || (( reset_gpu )); then
        echo "gpu-check: RESET: GPU 0's compute mode $m set to DEFAULT${found:+ (left by the kit run in $found)}" >&2
        tmo 20 nvidia-smi -i 0 -c DEFAULT >/dev/null 2>&1
        m=$(gpu_mode)
        [[ $m == Default ]] && return 0
        echo "gpu-check: the compute mode is still ${m:-unreadable}: stopping" >&2
        exit 2
    fi
    echo "gpu-check: GPU 0's compute mode is $m, not Default: processes outside MPS (quota, throttle) would get no context. Set it (nvidia-smi -i 0 -c DEFAULT), or pass --reset-gpu" >&2
    exit 2
}
[[ $mode == real ]] && reset_gpu_state
need=(libxcuda.so sysmonitor mps-manager online offline)
[[ $mode == emu ]] && need+=(libcuda.so libnvidia_ml.so emu-mps-control)
have_all() { local d="$1" f; for f in "${need[@]}"; do [[ -e "$d/$f" ]] || return 1; done; }
if [[ -z "$bin_dir" ]]; then
    for d in "$top/.gc/bin" "$top/target/release" "$top/target/debug"; do have_all "$d" && { bin_dir="$d"; break; }; done
fi
if [[ -z "$bin_dir" ]]; then
    command -v cargo >/dev/null 2>&1 || { echo "gpu-check: no built binaries and no cargo; pass --bin-dir" >&2; exit 2; }
    echo "gpu-check: building the node runtime and the workload programs" >&2
    (cd "$top" && cargo build -q --release -p xcuda-shim -p sysmonitor -p mps-manager -p workloads -p emu-cuda -p emu-nvml -p emu-mps-control) || exit 2
    bin_dir="$top/target/release"
fi
have_all "$bin_dir" || { echo "gpu-check: $bin_dir lacks one of: ${need[*]}" >&2; exit 2; }
bin_dir="$(cd "$bin_dir" && pwd)"
# Release or debug: PROFILE (scripts/gpu-check-pack.sh writes it), else the directory's name.
if [[ -r $bin_dir/PROFILE ]]; then bin_prof=$(head -n 1 "$bin_dir/PROFILE")
elif [[ $bin_dir == */debug ]]; then bin_prof=debug
elif [[ $bin_dir == */release ]]; then bin_prof=release
else bin_prof=unknown
fi
if [[ $bin_prof == debug && $mode == real ]] && (( ! allow_debug )); then
    echo "gpu-check: $bin_dir holds debug builds: the timing rows (throttle, node, recovery, monitor-cpu, nvml-cost, launch-cost) would measure debug code. Build release binaries (scripts/gpu-check-pack.sh packs them), or pass --allow-debug" >&2
    exit 2
fi
bin_note="$bin_prof build"
[[ $bin_prof == debug ]] && bin_note="DEBUG build: timing figures (throttle, node, recovery, monitor-cpu, nvml-cost, launch-cost) are not a release's"
[[ $bin_prof == unknown ]] && bin_note="build profile unknown (no PROFILE file)"
# Offline processes run as this user when the kit runs as root (offline containers are not root).
# Under MPS the online client runs as that user too: MPS serves one user at a time (a client
# of another user is queued until the running server's clients are done), so a node runs its
# online service and offline containers as one uid (README, "One user per MPS GPU").
as_user=()
mps_uid=$(id -u)
if [[ $(id -u) == 0 ]] && command -v setpriv >/dev/null 2>&1; then
    as_user=(setpriv --reuid=65534 --regid=65534 --clear-groups)
    mps_uid=65534
fi
unreadable() { # those of "$@" (paths) that the kit's offline user cannot read, or run
    local f out=""
    for f in "$@"; do
        case $f in
            *.so|*.py) "${as_user[@]}" test -r "$f" || out+=" $f" ;;
            *) "${as_user[@]}" test -r "$f" -a -x "$f" || out+=" $f" ;;
        esac
    done
    echo "${out# }"
}

root="$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")"
chmod 755 "$root"
pids=()
cleanup() {
    local st=$? p
    if [[ -n "${rows+x}" && -z "${table_printed:-}" ]]; then
        # Stopped before the end (a shell error in a check, a signal): the rows so far, and a
        # FAIL row naming where it stopped, so that no run ends without a table.
        row "${current:-kit}" FAIL "the kit stopped here (exit $st)" "${stopped_by:-a shell error in this check (see the lines above)}; later checks not run"
        print_table
        st=1
    fi
    # mps-manager quits MPS and puts the compute mode back on SIGTERM: up to 10 s for all.
    stop_pids "${pids[@]}"
    if [[ -n "${mps_up:-}" ]]; then
        local d; d=$(tr -dc '0-9' 2>/dev/null <"$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid")
        echo quit | mpsctl >/dev/null 2>&1
        if [[ -n $d ]] && ! wait_pid "$d" 10; then
            echo "gpu-check: the MPS control daemon $d did not quit in 10 s: SIGKILL" >&2
            kill -KILL "$d" 2>/dev/null
        fi
    fi
    # mps-manager puts the compute mode it found back when it quits MPS; if it was cut short,
    # so does the kit (a real GPU's mode outlives the kit until reboot).
    if [[ -n "${mode0:-}" ]] && [[ "$(gpu_mode)" != "$mode0" ]]; then
        tmo 20 nvidia-smi -i 0 -c "$(echo "$mode0" | tr '[:lower:]' '[:upper:]')" >/dev/null 2>&1
    fi
    if [[ $mode == real ]]; then
        echo "gpu-check: after cleanup: compute mode $(gpu_mode) (found ${mode0:-?}); MPS control daemons: $(mps_daemons | tr '\n' ';' | sed 's/;$//')" >&2
    fi
    if [[ -n "${GPU_CHECK_KEEP:-}" ]]; then echo "gpu-check: kept $root" >&2; else rm -rf "$root"; fi
    exit "$st"
}
trap cleanup EXIT
trap 'stopped_by="stopped by SIGTERM"; exit 143' TERM
trap 'stopped_by="stopped by SIGINT"; exit 130' INT
echo $$ >"$root/kit.pid"
mkdir -p "$root/run" "$root/mps-pipe" "$root/mps-log" "$root/bin" "$root/lib"
chmod 1777 "$root/run" "$root/mps-pipe" "$root/mps-log"
cp "$here/gpu_check_client.py" "$root/client.py"
chmod 644 "$root/client.py"
client="$root/client.py"
if (( ${#as_user[@]} )); then
    # A preloaded library its user cannot read is skipped by the loader with a mere warning:
    # "shimmed" rows would run unshimmed. Copies in the scratch directory (755) then, or stop.
    bad=$(unreadable "${need[@]/#/$bin_dir/}")
    if [[ -n $bad ]]; then
        echo "gpu-check: uid 65534 cannot read (or run) $bad: using copies in $root/bin-copy" >&2
        mkdir -p "$root/bin-copy"
        for f in "${need[@]}"; do cp -L "$bin_dir/$f" "$root/bin-copy/$f"; chmod 755 "$root/bin-copy/$f"; done
        chmod 755 "$root/bin-copy"
        bin_dir="$root/bin-copy"
    fi
    bad=$(unreadable "${need[@]/#/$bin_dir/}" "$client")
    if [[ -n $bad ]]; then
        echo "gpu-check: uid 65534 cannot read $bad (is ${TMPDIR:-/tmp} open to all?): shimmed rows would run unshimmed; stopping" >&2
        exit 2
    fi
fi
if [[ $mode == emu ]]; then
    ln -s "$bin_dir/libcuda.so" "$root/lib/libcuda.so.1"
    ln -s "$bin_dir/libnvidia_ml.so" "$root/lib/libnvidia-ml.so.1"
    ln -s "$bin_dir/emu-mps-control" "$root/bin/nvidia-cuda-mps-control"
    export LD_LIBRARY_PATH="$root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export PATH="$root/bin:$PATH" GPUEMU_STATE="$root/gpu0.state" GPUEMU_PROFILE="$profile"
    touch "$GPUEMU_STATE"; chmod 666 "$GPUEMU_STATE"
    label="emulated $profile"
else
    label="$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader -i 0 2>/dev/null | head -1)"
    mode0="$(gpu_mode)"
fi
export XSHARE_LEDGER_DIR="$root/run" CUDA_MPS_PIPE_DIRECTORY="$root/mps-pipe" CUDA_MPS_LOG_DIRECTORY="$root/mps-log"
shim_env=(env LD_PRELOAD="$bin_dir/libxcuda.so" XCUDA_CONFIG="$root/xcuda.json")

rows=()
failed=0
current="" table_printed=""
print_table() {
    table_printed=1
    echo
    echo "GPU check kit on $label"
    echo "binaries: $bin_dir ($bin_note)"
    printf '%-14s %-5s %-34s %s\n' check result figure detail
    printf '%s\n' "------------------------------------------------------------------------------------------------"
    printf '%s\n' "${rows[@]}"
}
plain() { sed 's/\x1b\[[0-9;]*m//g' | tr '\n' ' ' | cut -c1-"${1:-200}"; }
row() { # check result figure detail
    rows+=("$(printf '%-14s %-5s %-34s %s' "$1" "$2" "$3" "$4")")
    [[ $2 == FAIL ]] && failed=1
    printf 'gpu-check: %-14s %-5s %s %s\n' "$1" "$2" "$3" "$4" >&2
}
jget() { "$py" -c 'import json,sys
k=sys.argv[1]
for line in sys.stdin:
    try: o=json.loads(line)
    except ValueError: continue
    if k in o: v=o[k]
print(v if "v" in dir() else "")' "$1"; }
nvml_used() { tmo 30 "$py" "$client" nvml-used 0 2>>"$root/nvml-used.err" | jget used_mib; }
isnum() { [[ ${1:-} =~ ^-?[0-9]+$ ]]; } # an integer a row may do arithmetic with
bad_figures() { # names of the variables among "$@" that hold no integer, with their values
    local v out=""
    for v in "$@"; do isnum "${!v:-}" || out+=" $v=${!v:-empty}"; done
    echo "${out# }"
}

start_monitor() {
    # The operator's throttle floor (`offline_throttle`) loosened so far that launch-cost's
    # rates out of reach stay out of reach; every other check runs the shim's shipped
    # settings, which the default floor equals, and none turns its throttle off.
    cat >"$root/sysmonitor.json" <<EOF
{ "interval_ms": 10, "ledger_dir": "$root/run", "state_file": "$root/run/state.json",
  "metrics_listen": null, "evictor": { "grace_ms": 2000 },
  "offline_throttle": { "max_target_load": 1.0, "max_rate": 1e15, "max_fallback_rate": 1e15 }${GPU_CHECK_MONITOR_EXTRA:+, $GPU_CHECK_MONITOR_EXTRA} }
EOF
    "$bin_dir/sysmonitor" run --config "$root/sysmonitor.json" >"$root/sysmonitor.log" 2>&1 &
    pids+=($!); mon_pid=$!
    local i
    for i in $(seq 100); do
        grep -q '"state": *"healthy"' "$root/run/state.json" 2>/dev/null && return 0
        sleep 0.1
    done
    return 1
}

# --- monitor CPU and launch cost --------------------------------------------------------
thread_ns() { # "name:tid ns" per thread of pid $1
    local t v
    for t in /proc/"$1"/task/*; do
        read -r v _ <"$t/schedstat" 2>/dev/null && echo "$(cat "$t/comm" 2>/dev/null):${t##*/} $v"
    done
}
run_ns() { # scheduler run time so far of all threads of pid $1, ns
    local t n=0 v
    for t in /proc/"$1"/task/*/schedstat; do read -r v _ <"$t" 2>/dev/null && n=$(( n + v )); done
    echo "$n"
}
check_monitor_cpu() {
    # An offline process holding a context keeps the monitor at its full pace (it samples
    # every 100 ms while no offline work is registered on the GPU).
    local secs=$(( quick ? 3 : 12 )) a b t0 t1 pct h
    echo '{ "group": "gpu-check" }' >"$root/xcuda.json"
    "${as_user[@]}" "${shim_env[@]}" "$py" "$client" hold 64 >"$root/cpu-hold.out" 2>"$root/cpu-hold.err" &
    h=$!
    for _ in $(seq 50); do grep -q holding "$root/cpu-hold.out" 2>/dev/null && break; sleep 0.1; done
    # Beside it, the wake-up floor of this host: a loop that only sleeps 10 ms at a time
    # (Python's own per-wake-up cost included, a microsecond or two).
    "$py" -c 'import time
while True: time.sleep(0.01)' &
    local fl=$! windows=$(( quick ? 1 : 4 )) w fa fb mons=() floors=()
    pids+=($fl)
    sleep 1
    local before; before=$(thread_ns "$mon_pid")
    t0=$(date +%s%N); local T0=$t0
    for w in $(seq "$windows"); do
        a=$(run_ns "$mon_pid"); fa=$(run_ns "$fl"); t0=$(date +%s%N)
        sleep $(( secs / windows ))
        b=$(run_ns "$mon_pid"); fb=$(run_ns "$fl"); t1=$(date +%s%N)
        mons+=("$(( (b - a) * 1000000 / (t1 - t0) ))"); floors+=("$(( (fb - fa) * 1000000 / (t1 - t0) ))")
    done
    local after; after=$(thread_ns "$mon_pid")
    kill -TERM $fl 2>/dev/null
    local alive=yes; kill -0 $h 2>/dev/null || alive="no (evicted?)"
    stop_pids $h
    # Per window, in millionths of a core: the monitor's min / median, the floor's median.
    local mm; mm=$("$py" -c "import statistics as s; m=[int(x)/1e4 for x in '${mons[*]}'.split()]; f=[int(x)/1e4 for x in '${floors[*]}'.split()]; print(f'{min(m):.2f} / {s.median(m):.2f}|{s.median(f):.2f}')")
    pct=${mm%%|*}; local floor=${mm#*|}
    t0=$T0
    # Per thread: where the time goes (sampler, XID events, metrics).
    local per; per=$("$py" -c '
import sys
b = dict(l.rsplit(" ", 1) for l in sys.argv[1].splitlines() if l)
a = dict(l.rsplit(" ", 1) for l in sys.argv[2].splitlines() if l)
dt = float(sys.argv[3])
out = []
for k, v in a.items():
    name, _, tid = k.rpartition(":")
    d = (int(v) - int(b.get(k, 0))) / dt * 100
    out.append((d, name))
print(", ".join(f"{n} {d:.2f} %" for d, n in sorted(out, reverse=True)[:4]))' "$before" "$after" "$(( t1 - t0 ))")
    row monitor-cpu INFO "${pct} % of a core at 10 ms" "min / median of $windows windows in ${secs} s; wake-up floor beside it (a loop sleeping 10 ms) ${floor} %; one offline process registered (still there: $alive), GPU idle; threads: $per"
}
check_nvml_cost() {
    # Twice: back to back (each query at its cheapest) and spaced 10 ms apart as the monitor
    # makes them (cold caches), with whole sample ticks timed the monitor's way at the end.
    local calls=$(( quick ? 200 : 1000 )) spaced=$(( quick ? 30 : 200 )) json sjson
    json=$(tmo 120 "$bin_dir/sysmonitor" nvml-cost --config "$root/sysmonitor.json" --calls "$calls" --json 2>"$root/nvml-cost.err")
    sjson=$(tmo 120 "$bin_dir/sysmonitor" nvml-cost --config "$root/sysmonitor.json" --calls "$spaced" --gap-ms 10 --json 2>>"$root/nvml-cost.err")
    tmo 120 "$bin_dir/sysmonitor" nvml-cost --config "$root/sysmonitor.json" --calls "$calls" >"$root/nvml-cost.txt" 2>/dev/null
    tmo 120 "$bin_dir/sysmonitor" nvml-cost --config "$root/sysmonitor.json" --calls "$spaced" --gap-ms 10 >"$root/nvml-cost-spaced.txt" 2>/dev/null
    local fig; fig=$("$py" - "$json" "$sjson" <<'PY'
import json, sys
try:
    r, sp = json.loads(sys.argv[1]), json.loads(sys.argv[2])
except ValueError:
    print("")
    sys.exit()
def top(r):
    ok = [c for c in r["calls"] if not c["error"]]
    t = sorted(ok, key=lambda c: -c["cpu_ns"] * c["per_sec"])[:3]
    return ", ".join("%s %.1f us x %.0f/s" % (c["query"].split()[0], c["cpu_ns"] / 1e3, c["per_sec"]) for c in t)
tick = sp.get("tick_cpu_ns")
tk = "%.1f us a tick = %.3f %%" % (tick / 1e3, tick * 1000 / sp["interval_ms"] / 1e7) if tick else "a tick failed"
print("%.3f %% back to back, %.3f %% spaced|at %d ms; spaced 10 ms apart: %s; whole ticks %s; back to back: %s" % (
    r["total_core_pct"], sp["total_core_pct"], r["interval_ms"], top(sp), tk, top(r)))
PY
)
    if [[ -n "$fig" ]]; then
        row nvml-cost INFO "${fig%%|*}" "${fig#*|} (tables: nvml-cost.txt, nvml-cost-spaced.txt in the scratch dir)"
    else
        row nvml-cost FAIL "-" "no figures (a run past 120 s is stopped): $(tail -n 2 "$root/nvml-cost.err" | plain)"
    fi
}
check_launch_cost() {
    local secs=$(( quick ? 2 : 3 )) i d s direct=() shimmed=() args
    args=(--duration "$secs" --json --report-interval 0 --kernels 1000 --kernel-us 0.001 --blocks 1 --threads 32 --state-mb 1)
    # Rate limits out of reach (the controller starts at the fallback rate and climbs over
    # seconds): what is left is the hot path itself, quota and token-bucket accounting.
    echo '{ "group": "gpu-check", "throttle": { "target_load": 1.0, "max_rate": 1e15, "fallback_rate": 1e15, "burst": 1e12 } }' >"$root/xcuda.json"
    for i in 1 2 3; do
        d=$(tmo $(( secs + 60 )) "${as_user[@]}" "$bin_dir/offline" "${args[@]}" 2>/dev/null | jget iters_per_s)
        s=$(tmo $(( secs + 60 )) "${as_user[@]}" "${shim_env[@]}" "$bin_dir/offline" "${args[@]}" 2>/dev/null | jget iters_per_s)
        direct+=("${d:-0}"); shimmed+=("${s:-0}")
    done
    local fig; fig=$("$py" - "${direct[*]}" "${shimmed[*]}" <<'PY'
import statistics, sys
d = [float(x) * 1000 for x in sys.argv[1].split()]
s = [float(x) * 1000 for x in sys.argv[2].split()]
if min(d) <= 0 or min(s) <= 0:
    print("")
else:
    md, ms = statistics.median(d), statistics.median(s)
    print(f"{ms/md:.3f}x direct rate|direct {md/1e3:.0f}k/s, shimmed {ms/1e3:.0f}k/s: {1e9/ms - 1e9/md:+.0f} ns per launch (medians of 3)")
PY
)
    if [[ -n "$fig" ]]; then
        local how="no MPS"; [[ -n "${mps_up:-}" ]] && how="under MPS"
        row launch-cost INFO "${fig%%|*}" "${fig#*|}; $how$(mgr_note)"
    else
        row launch-cost FAIL "-" "a launch loop gave no rate (each run stopped past $(( secs + 60 )) s; direct: ${direct[*]}; shimmed: ${shimmed[*]})"
    fi
}

# --- quota -------------------------------------------------------------------------------
check_quota() {
    local total quota base ctx with_ctx a b used now held1 held2 held bad
    total=$(tmo 60 "$py" "$client" quota 1 0 2>"$root/total.err" | jget reported_total_mib)
    if ! isnum "$total"; then
        row quota FAIL "-" "the GPU's memory size unreadable (${total:-no answer}): $(tail -n 2 "$root/total.err" | plain)"
        return
    fi
    quota=$(( total / 4 ))
    echo "{ \"memory\": { \"quota_bytes\": $(( quota << 20 )) }, \"group\": \"gpu-check\" }" >"$root/xcuda.json"
    base=$(nvml_used)
    # The context alone (real drivers hold a few hundred MiB per context outside any quota).
    "${as_user[@]}" "${shim_env[@]}" "$py" "$client" quota 64 0 --hold >"$root/ctx.out" 2>"$root/ctx.err" &
    a=$!; sleep 2; with_ctx=$(nvml_used); stop_pids $a
    "${as_user[@]}" "${shim_env[@]}" "$py" "$client" quota 64 "$total" --hold >"$root/q1.out" 2>"$root/q1.err" &
    a=$!
    "${as_user[@]}" "${shim_env[@]}" "$py" "$client" quota 64 "$total" --hold >"$root/q2.out" 2>"$root/q2.err" &
    b=$!
    sleep 3
    local gone=""
    kill -0 $a 2>/dev/null || gone+=" first"
    kill -0 $b 2>/dev/null || gone+=" second"
    now=$(nvml_used)
    held1=$(jget allocated_mib <"$root/q1.out"); held2=$(jget allocated_mib <"$root/q2.out")
    stop_pids $a $b
    bad=$(bad_figures base with_ctx now held1 held2)
    if [[ -z $gone && -n $bad ]]; then
        row quota FAIL "-" "unreadable figures (NVML, or the clients' reports): $bad; $(tail -n 2 "$root/nvml-used.err" "$root/q1.err" 2>/dev/null | plain)"
        return
    fi
    [[ -z $bad ]] && { ctx=$(( with_ctx - base )); used=$(( now - base - 2 * ctx )); held=$(( held1 + held2 )); }
    # Whoever the processes ran as: uid 65534 through setpriv, else the kit's own user.
    local who="uid $(id -u)"; [[ ${#as_user[@]} -gt 0 ]] && who="uid 65534"
    [[ $who == "uid 0" ]] && who="root"
    if [[ -n $gone ]]; then
        row quota FAIL "-" "process(es)$gone gone before the measurement: $(tail -n 2 "$root/q1.err" | plain)"
    elif [[ $used -le $(( quota + 64 )) && $held -le $quota && $held -gt 0 ]]; then
        row quota PASS "$used MiB held / $quota MiB quota" "2 processes as $who; NVML outside the shim; ctx ${ctx} MiB each"
    else
        row quota FAIL "$used MiB held / $quota MiB quota" "2 processes as $who; shim says $held MiB; $(tail -n 3 "$root/q1.err" | plain)"
    fi
}

quarter_quota() { # the shim's config for quota group $1: a quarter of the GPU; prints its MiB
    local total quota
    total=$(tmo 60 "$py" "$client" quota 1 0 2>/dev/null | jget reported_total_mib)
    isnum "$total" || total=0 # a quota of 0 MiB: the caller's row says the size was unreadable
    quota=$(( total / 4 ))
    echo "{ \"memory\": { \"quota_bytes\": $(( quota << 20 )) }, \"group\": \"$1\" }" >"$root/xcuda.json"
    echo "$quota"
}

check_pool_keep() {
    # A pool that keeps freed memory (release threshold UINT64_MAX, PyTorch's cudaMallocAsync
    # backend): 60 % of the quota allocated with cuMemAllocAsync and freed stays in the pool, so
    # cuMemAlloc of 60 % more must be refused (CUDA_ERROR_OUT_OF_MEMORY, 2); after
    # cuMemPoolTrimTo(pool, 0) it fits. NVML, outside the shim, is read while the pool keeps the
    # chunk (the client waits for SIGUSR1 before its trim).
    local quota chunk base o a used
    quota=$(quarter_quota gpu-check-pool); chunk=$(( quota * 6 / 10 ))
    if (( quota <= 0 )); then row pool-keep FAIL "-" "the GPU's memory size unreadable"; return; fi
    base=$(nvml_used)
    "${as_user[@]}" "${shim_env[@]}" "$py" "$client" pool-keep "$chunk" --hold >"$root/pool.out" 2>"$root/pool.err" &
    a=$!
    if wait_line "$root/pool.out" '"phase": "kept"' 60 $a; then
        used=$(nvml_used)
        if isnum "$used" && isnum "$base"; then used="$(( used - base )) MiB incl. context, read while the pool kept the chunk"; else used="unreadable (${base:-?} before, ${used:-?} while kept)"; fi
        kill -USR1 $a 2>/dev/null
        wait_line "$root/pool.out" '"trimmed_mib"' 60 $a
    else
        used="not read: the client printed nothing in 60 s"; kill -0 $a 2>/dev/null || used="not read: the client exited first"
    fi
    stop_pids $a
    o=$(cat "$root/pool.out")
    local kept kept_rc trim_rc
    kept=$(jget kept_mib <<<"$o"); kept_rc=$(jget alloc_while_kept <<<"$o"); trim_rc=$(jget alloc_after_trim <<<"$o")
    local detail="pool kept ${kept:-?} MiB after free+sync (driver's figure); cuMemAlloc then: ${kept_rc:-?}; after trim: ${trim_rc:-?}; NVML ${used}"
    if [[ -z $o || $(jget async_alloc <<<"$o") != 0 ]]; then
        row pool-keep FAIL "-" "cuMemAllocAsync: $(jget async_alloc <<<"$o") $(tail -n 2 "$root/pool.err" | plain)"
    elif [[ -n $(bad_figures kept) ]]; then
        row pool-keep FAIL "-" "the pool's reserved size unreadable: $detail"
    elif (( kept < chunk )); then
        row pool-keep INFO "$chunk MiB chunk" "the driver did not keep the freed memory: $detail"
    elif [[ $kept_rc == 2 && $trim_rc == 0 ]]; then
        row pool-keep PASS "$chunk MiB kept, more refused" "$detail"
    else
        row pool-keep FAIL "$chunk MiB kept" "$detail"
    fi
}

check_stack_limit() {
    # cuCtxSetLimit(CU_LIMIT_STACK_SIZE) reserves the stack for every resident thread: a raise
    # to about half the quota must succeed and NVML (outside the shim) must see no more than the
    # shim counts for it (else a raise escapes the quota on this driver); a raise to about twice
    # the quota must be refused (CUDA_ERROR_OUT_OF_MEMORY, 2).
    local quota o
    quota=$(quarter_quota gpu-check-stack)
    if (( quota <= 0 )); then row stack-limit FAIL "-" "the GPU's memory size unreadable"; return; fi
    o=$(tmo 120 "${as_user[@]}" "${shim_env[@]}" "$py" "$client" stack-limit "$quota" 2>"$root/stack.err")
    local rc=$?
    if timed_out $rc; then row stack-limit FAIL "timed out" "the client did not finish in 120 s: $(tail -n 2 "$root/stack.err" | plain)"; return; fi
    local half over counted before after
    half=$(jget set_half <<<"$o"); over=$(jget set_over <<<"$o"); counted=$(jget counted_mib <<<"$o")
    before=$(jget nvml_before_mib <<<"$o"); after=$(jget nvml_after_mib <<<"$o")
    local moved="?"; isnum "$before" && isnum "$after" && moved=$(( after - before ))
    local detail="stack $(jget stack_bytes <<<"$o") B x $(jget resident_threads <<<"$o") threads: shim counts ${counted:-?} MiB, NVML +$moved MiB (before ${before:-?}, after ${after:-?}); 2x quota: ${over:-?}"
    if [[ -z $o || $half != 0 ]]; then
        row stack-limit FAIL "-" "cuCtxSetLimit to half the quota: ${half:-?} $(tail -n 2 "$root/stack.err" | plain)"
    elif [[ $over != 2 ]]; then
        row stack-limit FAIL "${counted} MiB counted" "a raise past the quota was not refused: $detail"
    elif ! isnum "$counted"; then
        row stack-limit FAIL "-" "the client reported no counted size: $detail"
    elif [[ $moved == "?" ]]; then
        row stack-limit INFO "${counted} MiB counted" "NVML gives no per-process figure here; $detail"
    elif (( moved * 2 < counted )); then
        row stack-limit INFO "${counted} MiB counted" "NVML moved less than half of it: the driver did not reserve the stack when it was raised, so nothing is measured; $detail"
    elif (( moved <= counted + 64 )); then
        row stack-limit PASS "${counted} MiB counted" "$detail"
    else
        row stack-limit FAIL "${counted} MiB counted" "the driver reserved more than the shim counts: $detail"
    fi
}

check_capture_mem() {
    # A captured graph (PyTorch's CUDA graphs with cudaMallocAsync): a 60 %-of-quota memory node
    # captured from cuMemAllocAsync (nothing allocated then), 60 % more allocated with cuMemAlloc,
    # then the graph launched: the launch must be refused (CUDA_ERROR_OUT_OF_MEMORY, 2) before
    # anything is mapped. This is what rests on the driver's cuStreamGetCaptureInfo.
    local quota chunk o
    quota=$(quarter_quota gpu-check-capture); chunk=$(( quota * 6 / 10 ))
    if (( quota <= 0 )); then row capture-mem FAIL "-" "the GPU's memory size unreadable"; return; fi
    o=$(tmo 120 "${as_user[@]}" "${shim_env[@]}" "$py" "$client" capture-mem "$chunk" 2>"$root/capture.err")
    local rc=$?
    if timed_out $rc; then row capture-mem FAIL "timed out" "the client did not finish in 120 s: $(tail -n 2 "$root/capture.err" | plain)"; return; fi
    local node plain launch
    node=$(jget node <<<"$o"); plain=$(jget plain_alloc <<<"$o"); launch=$(jget launch <<<"$o")
    local detail="captured node: ${node:-?}, end $(jget end <<<"$o"), instantiate $(jget instantiate <<<"$o"); cuMemAlloc: ${plain:-?}; launch: ${launch:-?}"
    if [[ -z $o || $node != 0 || $plain != 0 ]]; then
        row capture-mem FAIL "-" "$detail $(tail -n 2 "$root/capture.err" | plain)"
    elif [[ $launch == -1 && $(jget end <<<"$o") != 0 ]]; then
        row capture-mem FAIL "capture failed" "cuStreamEndCapture returned $(jget end <<<"$o"): no graph to launch; $detail $(tail -n 2 "$root/capture.err" | plain)"
    elif [[ $launch == -1 ]]; then
        row capture-mem FAIL "instantiate failed" "cuGraphInstantiateWithFlags returned $(jget instantiate <<<"$o"): no graph to launch; $detail $(tail -n 2 "$root/capture.err" | plain)"
    elif [[ $launch == 2 ]]; then
        row capture-mem PASS "${chunk} MiB graph refused" "$detail"
    else
        row capture-mem FAIL "${chunk} MiB graph launched" "a captured graph launched past the quota: $detail"
    fi
}

check_small_allocs() {
    # Many small allocations: the shim counts the bytes asked for; a driver that backs each
    # with whole pages (2 MiB large pages) charges more, which NVML shows outside the shim.
    local quota o a ctx held asked n size refused charged
    quota=$(quarter_quota gpu-check-small); n=1000
    if (( quota <= 0 )); then row small-allocs FAIL "-" "the GPU's memory size unreadable"; return; fi
    "${as_user[@]}" "${shim_env[@]}" "$py" "$client" small-allocs "$n" 4 >"$root/small.out" 2>"$root/small.err" &
    a=$!
    if ! wait_line "$root/small.out" '"phase": "ctx"' 60 $a; then
        stop_pids $a
        row small-allocs FAIL "-" "the client made no context in 60 s: $(tail -n 2 "$root/small.err" | plain)"; return
    fi
    ctx=$(nvml_used); kill -USR1 $a 2>/dev/null
    if ! wait_line "$root/small.out" '"phase": "held"' 120 $a; then
        stop_pids $a
        row small-allocs FAIL "-" "the client did not finish its allocations in 120 s: $(tail -n 2 "$root/small.err" | plain)"; return
    fi
    held=$(nvml_used); kill -USR1 $a 2>/dev/null
    wait_line "$root/small.out" '"freed"' 60 $a; stop_pids $a
    o=$(grep '"phase": "held"' "$root/small.out")
    asked=$(jget asked_mib <<<"$o"); n=$(jget allocations <<<"$o"); size=$(jget size_bytes <<<"$o"); refused=$(jget refused <<<"$o")
    if [[ -n $(bad_figures ctx held n) ]] || ! [[ $asked =~ ^[0-9]+(\.[0-9]+)?$ ]]; then
        row small-allocs FAIL "-" "unreadable figures: NVML ${ctx:-?} / ${held:-?} MiB, the client's ${asked:-?} MiB in ${n:-?}; $(tail -n 2 "$root/small.err" | plain)"; return
    fi
    charged=$(( held - ctx ))
    local detail="$n allocations of $size bytes (${asked} MiB asked, all the shim counts; refused at the end: ${refused:-0}); NVML charged ${charged} MiB for them"
    if (( n == 0 )); then
        row small-allocs FAIL "-" "no allocation made: $detail $(tail -n 2 "$root/small.err" | plain)"
    elif awk -v c="$charged" -v a="$asked" 'BEGIN { exit !(c <= a * 1.05 + 16) }'; then
        row small-allocs PASS "${charged} MiB for ${asked} MiB" "$detail"
    else
        row small-allocs FAIL "${charged} MiB for ${asked} MiB" "the driver charges more than the shim counts (its allocation granularity): the quota is looser by the difference; $detail"
    fi
}

check_torch_quota() {
    # Its own quota, a quarter of the GPU, judged against that (not the GPU's total).
    local out quota
    quota=$(quarter_quota gpu-check-torch)
    out=$(tmo 300 "${shim_env[@]}" "$py" "$client" torch-quota 128 1000000 2>"$root/torch.err")
    local rc=$?
    if timed_out $rc; then row torch-quota FAIL "timed out" "PyTorch's client did not finish in 300 s: $(tail -n 2 "$root/torch.err" | plain)"; return; fi
    if [[ -n "$(jget skipped <<<"$out")" ]]; then
        row torch-quota SKIP "-" "$(jget skipped <<<"$out")"
        return
    fi
    local got; got=$(jget allocated_mib <<<"$out")
    if isnum "$got" && (( quota > 0 && got > 0 && got <= quota )); then
        row torch-quota PASS "$got MiB of $quota MiB quota" "torch $(jget torch <<<"$out"): $(jget error <<<"$out" | cut -c1-60)"
    else
        row torch-quota FAIL "${got:-?} MiB of $quota MiB quota" "$(tail -n 3 "$root/torch.err" | plain)"
    fi
}

# --- throttle ----------------------------------------------------------------------------
offline_rate() { # prints iterations/s of the last summary line, or empty
    jget iters_per_s <"$1"
}
window_rate() { # iterations/s of progress file $1 between $2 and $3 seconds (default: its
    # last progress line), or empty. The count at a moment is interpolated between the lines
    # around it (a held job prints none until its next iteration ends).
    "$py" - "$1" "$2" "${3:-}" <<'PY'
import json, sys
pts = [(0.0, 0)]
for line in open(sys.argv[1]):
    try:
        o = json.loads(line)
    except ValueError:
        continue
    if "t_s" in o and "iterations" in o and not o.get("final"):
        pts.append((o["t_s"], o["iterations"]))
lo = float(sys.argv[2])
hi = float(sys.argv[3]) if sys.argv[3] else pts[-1][0]
def at(t):
    for (s0, n0), (s1, n1) in zip(pts, pts[1:]):
        if s0 <= t <= s1:
            return n0 + (n1 - n0) * (t - s0) / (s1 - s0) if s1 > s0 else n1
    return pts[-1][1]
if hi > lo and pts[-1][0] >= hi:
    print("%.4g" % ((at(hi) - at(lo)) / (hi - lo)))
PY
}
check_throttle() {
    # Not shorter when quick: on Hopper the monitor reads SM activity from GPM every 500 ms and
    # its counters change about once a second, so the throttle settles over a few seconds; the
    # rate judged is the settled one (after 4 s), the whole run's is shown beside it.
    local secs=10 settle=4 alone="$solo_rate" shimmed whole st evicted
    echo '{ "group": "gpu-check", "throttle": { "target_load": 0.5 } }' >"$root/xcuda.json"
    tmo $(( secs + 60 )) "${as_user[@]}" "${shim_env[@]}" "$bin_dir/offline" --duration "$secs" --json --report-interval 1 >"$root/off-shim.out" 2>"$root/off-shim.err"
    st=$?; timed_out $st && st="$st (timed out at $(( secs + 60 )) s)"
    whole=$(offline_rate "$root/off-shim.out")
    shimmed=$(window_rate "$root/off-shim.out" "$settle")
    evicted=$(grep -c -i 'evict' "$root/sysmonitor.log")
    local ratio; ratio=$("$py" -c "a,b='$alone','$shimmed'; print(f'{float(b)/float(a):.2f}' if a and b else '')")
    local wr; wr=$("$py" -c "a,b='$alone','$whole'; print(f'{float(b)/float(a):.2f}' if a and b else '?')")
    if [[ -n "$ratio" && $st == 0 && $evicted == 0 ]] && "$py" -c "import sys; sys.exit(0 if $ratio <= 0.8 else 1)"; then
        row throttle PASS "${ratio}x solo rate at target 0.5" "settled (after ${settle} s): alone $alone it/s, shimmed $shimmed it/s (${wr}x over all ${secs} s), not evicted"
    else
        row throttle FAIL "${ratio:-?}x solo rate at target 0.5" "settled (after ${settle} s): alone ${alone:-?} it/s, shimmed ${shimmed:-?} it/s (${wr}x over all ${secs} s), exit $st, eviction lines $evicted"
        # What the throttle saw and did, for a failure on a machine that is gone afterwards (CI).
        {
            echo "gpu-check: throttle: the offline client's progress and the shim's log:"
            sed 's/^/    /' "$root/off-shim.out"
            grep -i 'xcuda' "$root/off-shim.err" | tail -n 20 | sed 's/^/    /'
            echo "gpu-check: throttle: the monitor's last transitions:"
            grep 'health transition' "$root/sysmonitor.log" | tail -n 8 | sed 's/^/    /'
        } >&2
    fi
}
check_throttle_cap() {
    local secs=$(( quick ? 3 : 6 )) alone="$solo_rate" st capped ratio
    echo '{ "group": "gpu-check", "throttle": { "target_load": 0.5 } }' >"$root/xcuda.json"
    # The job as deployed beside an online service: an MPS cap of 40 % in its environment (MPS
    # enforces it) arms the online-pressure hold (a low SM clock). Alone on an idle GPU, whose
    # clock may idle low, it must still run: nothing online is there to protect.
    tmo $(( secs + 60 )) "${as_user[@]}" "${shim_env[@]}" CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=40 "$bin_dir/offline" --duration "$secs" --json --report-interval 0 >"$root/off-cap.out" 2>"$root/off-cap.err"
    st=$?; timed_out $st && st="$st (timed out at $(( secs + 60 )) s)"
    capped=$(offline_rate "$root/off-cap.out")
    ratio=$("$py" -c "a,b='$alone','$capped'; print(f'{float(b)/float(a):.2f}' if a and b else '')")
    if [[ -n "$ratio" && $st == 0 ]] && "$py" -c "import sys; sys.exit(0 if $ratio >= 0.2 else 1)"; then
        row throttle-cap PASS "${ratio}x solo rate, 40 % MPS cap" "alone on the GPU: not held for a low clock; $capped it/s"
    else
        row throttle-cap FAIL "${ratio:-?}x solo rate, 40 % MPS cap" "alone on an idle GPU the job was starved: ${capped:-?} it/s, exit $st"
    fi
}

# --- exit under MPS ----------------------------------------------------------------------
mps_servers() { echo get_server_list | mpsctl 2>/dev/null | tr -dc '0-9\n' | grep . | tr '\n' ' ' | sed 's/ $//'; }
mps_clients() { # the pids of the clients of MPS servers "$@", one line
    local srv
    for srv in "$@"; do echo "get_client_list $srv" | mpsctl 2>/dev/null; done | tr -dc '0-9\n' | grep . | tr '\n' ' ' | sed 's/ $//'
}
mps_logs() { # the tails of MPS's own logs, for a row that says MPS failed
    echo "control log: $(tail -n 2 "$root/mps-log/control.log" 2>/dev/null | plain 200); server log: $(tail -n 2 "$root/mps-log/server.log" 2>/dev/null | plain 200)"
}
start_mps() { # the control daemon, confirmed serving; else 1 and mps_why says why
    mps_why=""
    if ! mpsctl -d </dev/null >"$root/mps-start.out" 2>&1; then
        mps_why="nvidia-cuda-mps-control -d failed: $(tail -n 2 "$root/mps-start.out" | plain 200)"
        return 1
    fi
    mps_up=1
    # A first client starts the server (MPS refuses clients when it cannot start one); it
    # holds a context while the daemon is asked for its servers.
    local h got="" servers c
    "${as_user[@]}" env "$py" "$client" hold 1 >"$root/mps-first.out" 2>"$root/mps-first.err" &
    h=$!; pids+=($h)
    for _ in $(seq 600); do
        grep -q holding "$root/mps-first.out" 2>/dev/null && { got=held; break; }
        kill -0 $h 2>/dev/null || { got=exited; break; }
        sleep 0.1
    done
    servers=$(mps_servers)
    stop_pids $h
    if [[ $got != held || -z $servers ]]; then
        case $got in
            held) c="got a context" ;;
            exited) c="exited without a context" ;;
            *) c="neither got a context nor exited in 60 s" ;;
        esac
        mps_why="MPS is not serving: the first client $c, servers listed: ${servers:-none}; client: $(tail -n 2 "$root/mps-first.err" | plain 200); $(mps_logs)"
        echo "gpu-check: $mps_why" >&2
        return 1
    fi
}
check_exit() {
    local n=$(( quick ? 4 : ${GPU_CHECK_EXIT_RUNS:-20} )) i sig hung=0 bad=0 online st
    echo '{ "group": "gpu-check" }' >"$root/xcuda.json"
    "${as_user[@]}" "$bin_dir/online" --rate 50 --duration 600 --json >"$root/online-exit.out" 2>&1 &
    online=$!; pids+=($online)
    sleep 1
    for i in $(seq "$n"); do
        past_deadline && { n=$(( i - 1 )); break; } # cut short: the row counts those sent
        sig=INT; (( i % 2 == 0 )) && sig=TERM
        "${as_user[@]}" "${shim_env[@]}" "$py" "$client" hold 64 >"$root/hold.out" 2>"$root/hold.err" &
        local h=$!
        for _ in $(seq 50); do grep -q holding "$root/hold.out" 2>/dev/null && break; sleep 0.1; done
        sleep "0.$(( RANDOM % 5 ))"
        kill -"$sig" $h
        st=0; wait_pid $h 20 || { st=1; kill -KILL $h 2>/dev/null; }
        wait $h 2>/dev/null; local rc=$?
        # 0: the client's own exit; 130/143: the default action of SIGINT/SIGTERM re-raised
        # by the shim after it released the context.
        [[ $rc == 0 || $rc == 130 || $rc == 143 ]] || bad=$((bad + 1))
        [[ $st != 0 ]] && bad=$((bad + 1))
    done
    # The neighbour must still complete requests: ask it for a summary and see requests keep coming.
    kill -INT $online; wait_pid $online 30 || { hung=1; kill -KILL $online 2>/dev/null; }
    local done_req; done_req=$(jget requests <"$root/online-exit.out")
    [[ -z "$done_req" || "$done_req" == 0 ]] && hung=1
    local how="no MPS"; [[ -n "${mps_up:-}" ]] && how="under MPS"
    [[ -n "${mps_why:-}" ]] && how="MPS not confirmed serving (see the SKIP rows)"
    if [[ $hung == 0 && $bad == 0 ]]; then
        row exit PASS "$n Ctrl-C/SIGTERM, 0 hung neighbours" "$how; online completed ${done_req} requests"
    else
        row exit FAIL "$n Ctrl-C/SIGTERM, hung=$hung" "$how; clients that did not exit cleanly: $bad"
    fi
}

# --- the MPS server as NVML lists it ------------------------------------------------------
check_mps_server() {
    local lines server others h
    # An MPS client holding a context (1 MiB), so that its server runs while NVML is asked.
    "${as_user[@]}" env "$py" "$client" hold 1 >"$root/mps-hold.out" 2>&1 &
    h=$!; pids+=($h)
    for _ in $(seq 100); do grep -q holding "$root/mps-hold.out" 2>/dev/null && break; sleep 0.1; done
    sleep 0.5
    lines=$(tmo 30 "$py" "$client" nvml-procs 0 2>"$root/nvml-procs.err")
    stop_pids $h
    echo "$lines" >"$root/nvml-procs.out"
    server=$(echo "$lines" | "$py" -c 'import json,sys
for o in map(json.loads, sys.stdin):
    if o.get("comm") == "nvidia-cuda-mps":
        print("pid %s, %s MiB" % (o["pid"], o["used_mib"]))
        break')
    others=$(echo "$lines" | "$py" -c 'import json,sys
print(", ".join("%s %s %s MiB" % (o["pid"], o["comm"] or "?", o["used_mib"]) for o in map(json.loads, sys.stdin) if "pid" in o))')
    if [[ -n "$server" ]]; then
        row mps-server PASS "listed by NVML: $server" "comm nvidia-cuda-mps: the monitor counts it as neither online nor offline"
    elif [[ -z "$lines" ]]; then
        row mps-server FAIL "-" "NVML process list unreadable: $(tail -n 2 "$root/nvml-procs.err" | plain)"
    else
        row mps-server INFO "no MPS server in NVML's list" "listed: ${others:-none}"
    fi
}

# --- the compute-mode fence --------------------------------------------------------------
check_fence() {
    # mps-manager holds the GPU in EXCLUSIVE_PROCESS (compute_mode, its default) where only the
    # MPS server holds a context of its own: a process that misses MPS (another pipe directory)
    # must get no context (CUDA_ERROR_DEVICE_UNAVAILABLE, 46). An MPS client holds its server up.
    local h r at mode found
    if [[ $(id -u) != 0 ]]; then
        row fence SKIP "-" "needs root: the compute mode is root's to set (mps-manager runs with compute_mode leave)"
        return
    fi
    need_manager fence || return
    if [[ -n "${mode_refused:-}" ]]; then
        row fence SKIP "-" "this host refused the compute mode: $mode_refused"
        return
    fi
    "${as_user[@]}" env "$py" "$client" hold 1 >"$root/fence-hold.out" 2>&1 &
    h=$!; pids+=($h)
    if ! wait_line "$root/fence-hold.out" holding 60 $h; then
        stop_pids $h
        row fence FAIL "no MPS client to hold the server" "an MPS client got no context under mps-manager in 60 s: $(tail -n 2 "$root/fence-hold.out" | plain 200); $(mps_logs)$(mgr_note)"
        return
    fi
    mode=$(tr -d '\n' 2>/dev/null <"$root/run/mps-manager.json" | jget compute_mode)
    if [[ $mode != exclusive_process ]]; then
        stop_pids $h
        row fence FAIL "compute mode ${mode:-unknown}" "mps-manager's state file does not say exclusive_process: the fence is not held, nothing to look at$(mgr_note)"
        return
    fi
    mkdir -p "$root/no-mps"; chmod 1777 "$root/no-mps"
    local line rc; line=$(tmo 60 "${as_user[@]}" env CUDA_MPS_PIPE_DIRECTORY="$root/no-mps" "$py" "$client" ctx 2>"$root/fence.err"); rc=$?
    stop_pids $h
    if timed_out $rc; then row fence FAIL "timed out" "a process outside MPS neither got a context nor was refused in 60 s: $(tail -n 1 "$root/fence.err" | plain)"; return; fi
    r=$(echo "$line" | jget result); at=$(echo "$line" | jget at)
    mode=$(tr -d '\n' <"$root/run/mps-manager.json" | jget compute_mode)
    found=$(tr -d '\n' <"$root/run/mps-manager.json" | jget compute_mode_found)
    [[ $found == None ]] && found="it so"
    local how="compute mode ${mode:-?} (found ${found:-?}) held by mps-manager"
    if [[ "$r" == 46 ]]; then
        row fence PASS "outside MPS: CUDA_ERROR_DEVICE_UNAVAILABLE" "$how: only the MPS server holds a context of its own$(mgr_note)"
    elif [[ "$r" == 0 ]]; then
        row fence FAIL "a process outside MPS got a context" "$how; mps-manager: $(grep -i 'compute mode' "$root/mps-manager.log" | tail -n 1 | plain)$(mgr_note)"
    else
        row fence INFO "outside MPS: CUresult ${r:-?} at ${at:-?}" "$how; $(tail -n 1 "$root/fence.err" | plain)$(mgr_note)"
    fi
}

# --- the MPS server's /dev/shm -------------------------------------------------------------
check_shm() {
    # An MPS server keeps the shared memory its clients attach to in its /dev/shm: a client
    # with a /dev/shm of its own (every container's default) should fail to connect. The
    # emulator refuses it with CUDA_ERROR_MPS_CONNECTION_FAILED (805); a context made here
    # (the probe listed as the server's client, its work done) would mean this host's MPS needs
    # no shared /dev/shm and the emulator is stricter than it.
    local h p line r at work pid servers clients="" listed=""
    if [[ $(id -u) != 0 ]] || ! command -v unshare >/dev/null 2>&1; then
        row shm SKIP "-" "needs root and unshare (a mount namespace with a /dev/shm of its own)"
        return
    fi
    need_manager shm || return
    "${as_user[@]}" env "$py" "$client" hold 1 >"$root/shm-hold.out" 2>&1 &
    h=$!; pids+=($h)
    for _ in $(seq 100); do grep -q holding "$root/shm-hold.out" 2>/dev/null && break; sleep 0.1; done
    unshare --mount --propagation private sh -c 'mount -t tmpfs -o size=64m,mode=1777 tmpfs /dev/shm && exec "$@"' sh \
        "${as_user[@]}" env "$py" "$client" ctx --hold >"$root/shm.out" 2>"$root/shm.err" &
    p=$!; pids+=($p)
    if ! wait_line "$root/shm.out" '"result"' 60 $p; then
        local why="exited without an answer"; kill -0 $p 2>/dev/null && why="neither connected nor was refused in 60 s"
        stop_pids $p $h
        row shm FAIL "own /dev/shm: no answer" "a client with its own /dev/shm $why: $(tail -n 1 "$root/shm.err" | plain)"
        return
    fi
    line=$(cat "$root/shm.out")
    r=$(jget result <<<"$line"); at=$(jget at <<<"$line"); work=$(jget work <<<"$line"); pid=$(jget pid <<<"$line")
    if [[ $r == 0 ]]; then
        servers=$(mps_servers); clients=$(mps_clients $servers)
        [[ " $clients " == *" $pid "* ]] && listed=1
    fi
    stop_pids $p $h
    if [[ "$r" == 805 ]]; then
        row shm PASS "own /dev/shm: CUresult 805 at ${at:-?}" "as the emulator has it: an MPS client must see its server's /dev/shm (mps-manager shm_dir, mounted into containers)$(mgr_note)"
    elif [[ "$r" == 0 && -n $listed ]]; then
        row shm INFO "own /dev/shm: MPS client, work ${work:-?}" "MPS served a client with a /dev/shm of its own (pid $pid listed by server(s) ${servers:-none}; 1 MiB set and synchronised: CUresult ${work:-?}): the emulator (805) is stricter than this host$(mgr_note)"
    elif [[ "$r" == 0 ]]; then
        row shm INFO "own /dev/shm: context made outside MPS" "the probe (pid $pid) is no MPS server's client (server(s) ${servers:-none}, clients: ${clients:-none}): not what this check asks$(mgr_note)"
    else
        row shm INFO "own /dev/shm: CUresult ${r:-?} at ${at:-?}" "$(tail -n 1 "$root/shm.err" | plain)"
    fi
}

# --- a read-only MPS pipe directory ------------------------------------------------------
check_pipe_ro() {
    # node-agent can mount the pipe directory read-only into offline containers
    # (inject.mps_pipe_read_only), so that a tenant cannot unlink the control daemon's socket
    # and bind its own. Connecting to a socket or opening a FIFO needs no write access to the
    # mount; whether a real MPS client also creates something there is what this tells: a client
    # in a mount namespace where the pipe directory is a read-only bind mount of itself.
    # A client holds the server up meanwhile, and the probe holds its context until MPS has been
    # asked for its clients: a context made outside MPS (the fence not held) is no PASS.
    local line r at before after h p pid servers clients="" listed=""
    if [[ $(id -u) != 0 ]] || ! command -v unshare >/dev/null 2>&1; then
        row pipe-ro SKIP "-" "needs root and unshare (a mount namespace with the pipe directory read-only)"
        return
    fi
    need_manager pipe-ro || return
    "${as_user[@]}" env "$py" "$client" hold 1 >"$root/pipe-ro-hold.out" 2>&1 &
    h=$!; pids+=($h)
    if ! wait_line "$root/pipe-ro-hold.out" holding 60 $h; then
        stop_pids $h
        row pipe-ro FAIL "no MPS client to hold the server" "an MPS client got no context in 60 s: $(tail -n 2 "$root/pipe-ro-hold.out" | plain 200); $(mps_logs)$(mgr_note)"
        return
    fi
    before=$(ls -A "$root/mps-pipe" | tr '\n' ' ')
    unshare --mount --propagation private sh -c 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"' \
        "$root/mps-pipe" "${as_user[@]}" env "$py" "$client" ctx --hold >"$root/pipe-ro.out" 2>"$root/pipe-ro.err" &
    p=$!; pids+=($p)
    if ! wait_line "$root/pipe-ro.out" '"result"' 60 $p; then
        local why="exited without an answer"; kill -0 $p 2>/dev/null && why="neither got a context nor was refused in 60 s"
        stop_pids $p $h
        row pipe-ro FAIL "read-only pipe dir: no answer" "the client through a read-only pipe dir $why: $(tail -n 2 "$root/pipe-ro.err" | plain)$(mgr_note)"
        return
    fi
    line=$(cat "$root/pipe-ro.out")
    r=$(jget result <<<"$line"); at=$(jget at <<<"$line"); pid=$(jget pid <<<"$line")
    if [[ $r == 0 ]]; then
        servers=$(mps_servers); clients=$(mps_clients $servers)
        [[ " $clients " == *" $pid "* ]] && listed=1
    fi
    after=$(ls -A "$root/mps-pipe" | tr '\n' ' ')
    stop_pids $p $h
    local fence="compute mode $(tr -d '\n' <"$root/run/mps-manager.json" | jget compute_mode)"
    clients="${clients% }"
    local seen="the probe (pid $pid) on MPS server(s) ${servers:-none}, clients: ${clients:-none}"
    if [[ "$r" == 0 && -n $listed && -z "${mode_refused:-}" ]]; then
        row pipe-ro PASS "context through a read-only pipe dir" "$fence; $seen: an MPS client needs no write access there; inject.mps_pipe_read_only can be on. Entries: $before$(mgr_note)"
    elif [[ "$r" == 0 && -z $listed ]]; then
        row pipe-ro INFO "context made outside MPS" "$fence; $seen: the probe is no MPS server's client, so the read-only pipe dir is not what it went through. Entries: $before$(mgr_note)"
    elif [[ "$r" == 0 ]]; then
        row pipe-ro INFO "context made (fence not held)" "the compute mode was refused ($mode_refused); $seen. Entries: $before$(mgr_note)"
    else
        row pipe-ro FAIL "read-only pipe dir: CUresult ${r:-?} at ${at:-?}" "an MPS client needs to write in the pipe directory: keep inject.mps_pipe_read_only off; $(tail -n 1 "$root/pipe-ro.err" | plain). Entries before: $before; after: $after$(mgr_note)"
    fi
}

# --- node runtime ------------------------------------------------------------------------
start_mps_manager() { # once: mps-manager owning MPS for the node and recovery checks; 1 when
    # it did not start (mgr_failed says why, with its log's tail)
    [[ -n "${mgr_up:-}" ]] && return 0
    [[ -n "${mgr_failed:-}" ]] && return 1
    local mode=exclusive_process m i size new
    # mps-manager's own refusal of the mode (mps-manager/src/main.rs, compute_mode.rs); not its
    # INFO line "GPU compute mode set to exclusive_process".
    local refused="cannot start MPS: ((setting|reading) GPU [0-9]+'s compute mode|compute_mode = \"exclusive_process\" needs NVML)"
    [[ $(id -u) == 0 ]] || mode=leave
    # The kit's clients run on the host, not in containers: the daemon keeps the host's
    # /dev/shm (shm_dir "host"), where its servers keep the shared memory clients attach to.
    for _ in 1 2; do
        cat >"$root/mps-manager.json" <<EOF
{ "control_bin": "$(command -v nvidia-cuda-mps-control)", "pipe_dir": "$root/mps-pipe",
  "log_dir": "$root/mps-log", "ledger_dir": "$root/run", "monitor_state_file": "$root/run/state.json",
  "state_file": "$root/run/mps-manager.json", "period_ms": 100, "client_uid": $mps_uid,
  "quit_on_exit": true, "compute_mode": "$mode", "shm_dir": "host" }
EOF
        size=$(stat -c %s "$root/mps-manager.log" 2>/dev/null || echo 0)
        "$bin_dir/mps-manager" run --config "$root/mps-manager.json" >>"$root/mps-manager.log" 2>&1 &
        m=$!
        # Up once its state file names it with a control daemon (the mode held, MPS adopted or
        # started); at most 15 s.
        for i in $(seq 150); do
            kill -0 $m 2>/dev/null || break
            [[ $(tr -d '\n' 2>/dev/null <"$root/run/mps-manager.json" | jget manager_pid) == "$m" ]] &&
                isnum "$(tr -d '\n' 2>/dev/null <"$root/run/mps-manager.json" | jget daemon_pid)" && break
            sleep 0.1
        done
        if kill -0 $m 2>/dev/null; then
            pids+=($m); mgr_pid=$m; mgr_up=1
            return 0
        fi
        wait $m 2>/dev/null
        new=$(tail -c +$(( size + 1 )) "$root/mps-manager.log" 2>/dev/null)
        if grep -qE "$refused" <<<"$new" && [[ $mode != leave ]]; then
            # A host that refuses the compute mode (a sandbox without the permission): the
            # other checks run with the mode left alone; the fence check says why it cannot run.
            mode_refused="$(grep -E "$refused" <<<"$new" | tail -n 1 | plain 240)"
            mode=leave
            continue
        fi
        mgr_failed="mps-manager exited at its start: $(tail -n 3 <<<"$new" | plain 300)"
        echo "gpu-check: $mgr_failed" >&2
        return 1
    done
}
need_manager() { # start_mps_manager for check $1, else its FAIL row (the manager's log tail)
    start_mps_manager && return 0
    row "$1" FAIL "mps-manager did not start" "$mgr_failed"
    return 1
}
stop_mps_manager() { # SIGTERM: it quits MPS and puts the compute mode back (quit_on_exit);
    # then MPS alone again for the checks that need no manager
    [[ -n "${mgr_up:-}" ]] || return 0
    local d
    stop_pids "$mgr_pid"
    mgr_up=""
    d=$(tr -dc '0-9' 2>/dev/null <"$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid")
    if [[ -n $d ]] && kill -0 "$d" 2>/dev/null; then
        echo quit | mpsctl >/dev/null 2>&1
        wait_pid "$d" 10 || { echo "gpu-check: MPS control daemon $d did not quit in 10 s: SIGKILL" >&2; kill -KILL "$d" 2>/dev/null; }
    fi
    mps_up=""
    if [[ -n "${mode0:-}" ]] && [[ "$(gpu_mode)" != "$mode0" ]]; then
        echo "gpu-check: mps-manager left the compute mode $(gpu_mode): setting $mode0 back" >&2
        tmo 20 nvidia-smi -i 0 -c "$(echo "$mode0" | tr '[:lower:]' '[:upper:]')" >/dev/null 2>&1
    fi
    start_mps
}
mgr_note() { # for rows run while mps-manager runs: whether it still does, and its recoveries
    [[ -n "${mgr_up:-}" ]] || return 0
    local alive="running"; kill -0 "$mgr_pid" 2>/dev/null || alive="EXITED ($(tail -n 1 "$root/mps-manager.log" | plain 160))"
    echo "; mps-manager $alive, recoveries so far: $(grep -c 'recovery done' "$root/mps-manager.log")"
}
check_node() {
    # MuxFlow's scenario: an online client at 50 requests/s on about 30 % of the SMs, then on the
    # whole GPU, alone and beside a back-to-back offline job under the node runtime. Issue 8's
    # targets, printed as figures (the kit's online loop is a stand-in for a real service):
    # 30 %: online p99 <= 1.10x alone with the offline job keeping >= 60 % of its solo rate;
    # whole GPU: online p99 <= 1.3x alone.
    local secs=$(( quick ? 3 : 8 )) frac alone beside off rate t0 t1 name fig ev
    need_manager node || return
    echo '{ "group": "gpu-check" }' >"$root/xcuda.json"
    for frac in 0.3 1.0; do
        name=node; [[ $frac == 1.0 ]] && name=node-full
        local online_args=(--rate 50 --duration "$secs" --kernels 4 --kernel-us 1000 --sm-fraction "$frac" --json)
        alone=$(tmo $(( secs + 60 )) "${as_user[@]}" "$bin_dir/online" "${online_args[@]}" 2>/dev/null | jget p99_ms)
        "${as_user[@]}" "${shim_env[@]}" "$bin_dir/offline" --duration $(( secs + 4 )) --json --report-interval 0.5 >"$root/off-$name.out" 2>&1 &
        off=$!
        sleep 2
        t0=$(date +%s%N)
        beside=$(tmo $(( secs + 60 )) "${as_user[@]}" "$bin_dir/online" "${online_args[@]}" 2>/dev/null | jget p99_ms)
        t1=$(date +%s%N)
        wait_pid $off 60 || kill -KILL $off 2>/dev/null; wait $off 2>/dev/null
        # The offline job's rate while the online client ran (its progress from 2 s on, for as
        # long as the online run lasted).
        rate=$(window_rate "$root/off-$name.out" 2 "$("$py" -c "print(2 + ($t1 - $t0) / 1e9)")")
        fig=$("$py" - "$alone" "$beside" "$rate" "$solo_rate" "$frac" <<'PY'
import sys
a, b, r, s, frac = sys.argv[1:6]
if not a or not b:
    sys.exit()
ratio = float(b) / float(a)
kept = float(r) / float(s) if r and s else None
if float(frac) < 1:
    met = ratio <= 1.10 and kept is not None and kept >= 0.60
    want = "p99<=1.10x, kept>=60%"
else:
    met = ratio <= 1.3
    want = "p99<=1.3x"
k = "%.0f%%" % (100 * kept) if kept is not None else "?"
print("p99 %.2fx alone, offline kept %s|%s %s" % (ratio, k, want, "met" if met else "NOT met"))
PY
)
        ev=$(grep -c -i 'evict' "$root/sysmonitor.log")
        if [[ -n "$fig" ]]; then
            row "$name" INFO "${fig%%|*}" "online on ${frac} of the SMs at 50/s: p99 alone ${alone} ms, beside ${beside} ms; offline ${rate:-?} it/s (solo ${solo_rate:-?}); target ${fig#*|}; monitor eviction lines: $ev$(mgr_note)"
        else
            row "$name" FAIL "-" "online client gave no summary (each run stopped past $(( secs + 60 )) s); see sysmonitor/mps-manager logs"
        fi
    done
}

recovery_run() { # run $1 of the recovery check, the offline client started with env "${@:2}"
    # Online at 30 % of the SMs beside an offline client that is SIGKILLed mid-run (once it has
    # made progress: its context and kernels are live); with term_ms set (check_recovery's
    # GPU_CHECK_RECOVERY_SIGTERM_FIRST) it gets SIGTERM first, ignores it and runs on, and the
    # SIGKILL comes term_ms later. Sets rec_outcome (ok, hung, died or notrun),
    # rec_max and rec_req (the online client's slowest request in ms and its request count)
    # and rec_why. Globals, not output: its processes must reach the cleanup list.
    local r=$1 on off st term_s=0 off_args=(); shift
    rec_outcome="" rec_max="" rec_req="" rec_why=""
    # Both clients outlast the grace: the SIGKILL must find them running.
    [[ -n $term_ms ]] && term_s=$(( (term_ms + 999) / 1000 )) off_args=(--ignore-sigterm)
    [[ -n $del_ms ]] && term_s=$(( (del_ms + 999) / 1000 ))
    # The pod's termination file as Allocate makes it: empty until the deletion.
    [[ -n $del_ms ]] && : >"$root/termination" && chmod 644 "$root/termination"
    "${as_user[@]}" "$bin_dir/online" --rate 50 --duration $(( secs + term_s )) --kernels 4 --kernel-us 1000 --sm-fraction 0.3 --json >"$root/online-recovery-$r.out" 2>&1 &
    on=$!; pids+=($on); rec_online=$on
    # Four kernels queued per synchronisation: the kill finds one in flight unless it lands in
    # the gap between a sync's return and the next launch, which a loaded host can stretch.
    "${as_user[@]}" "$@" "$bin_dir/offline" --duration $(( secs + 10 + term_s )) --kernels 4 --json --report-interval 0.5 "${off_args[@]}" >"$root/off-recovery-$r.out" 2>&1 &
    off=$!; pids+=($off)
    # Its first progress report: context made, kernels running (a loaded host may take a while;
    # a client that never got that far is a run that proves nothing, not a pass).
    for _ in $(seq 300); do grep -q '"t_s"' "$root/off-recovery-$r.out" 2>/dev/null && break; sleep 0.1; done
    if ! grep -q '"t_s"' "$root/off-recovery-$r.out" 2>/dev/null; then
        kill -KILL $off $on 2>/dev/null; wait "$off" "$on" 2>/dev/null
        rec_outcome=notrun
        rec_why="run $r: the offline client made no progress in 30 s ($(tail -n 1 "$root/off-recovery-$r.out" | plain 100))"
        return
    fi
    sleep "1.$(( RANDOM % 10 ))"
    # The kubelet's ways before its SIGKILL; `warned` says which, `wait_ms` how long before it.
    local warned="" wait_ms=""
    if [[ -n $term_ms ]]; then
        # SIGTERM, the grace period, SIGKILL. The client ignores the SIGTERM and its kernels go
        # on; a shimmed one knows the grace (XCUDA_KILL_GRACE_MS) and can drain its kernels
        # before the kill.
        kill -TERM $off 2>/dev/null
        warned="its SIGTERM" wait_ms=$term_ms
    elif [[ -n $del_ms ]]; then
        # A deletion that no SIGTERM announces to the client (its PID 1 keeps it): node-agent
        # writes it into the pod's termination file, in place, and the SIGKILL comes at its end.
        local now_ms; now_ms=$(( $(date +%s%N) / 1000000 ))
        printf 'xshare-termination 1\ndeletion_unix_ms %s\ngrace_ms %s\nend\n' $(( now_ms + del_ms )) "$del_ms" >"$root/termination"
        warned="its pod's deletion" wait_ms=$del_ms
    fi
    if [[ -n $warned ]]; then
        sleep "$(( wait_ms / 1000 )).$(printf '%03d' $(( wait_ms % 1000 )))"
        # One that ended meanwhile proves nothing.
        if ! kill -0 $off 2>/dev/null; then
            wait "$off" 2>/dev/null; st=$?
            kill -KILL $on 2>/dev/null; wait "$on" 2>/dev/null
            rec_outcome=notrun
            rec_why="run $r: the offline client ended (status $st) within ${wait_ms} ms of $warned, before the SIGKILL ($(tail -n 1 "$root/off-recovery-$r.out" | plain 100))"
            return
        fi
    fi
    if [[ -n "${GPU_CHECK_RECOVERY_TERMINATE_FIRST:-}" ]]; then
        # MPS's own way to end one client's GPU work (nvidia-cuda-mps-control(1)), then the kill.
        local srv; srv=$(echo get_server_list | mpsctl 2>/dev/null | head -1)
        echo "terminate_client $srv $off" | tmo 5 nvidia-cuda-mps-control >"$root/terminate-$r.out" 2>&1
        sleep 0.3
    fi
    kill -KILL $off 2>/dev/null
    wait "$off" 2>/dev/null # reaped here, so the shell reports no killed job
    st=0; wait_pid $on $(( secs + 30 )) || st=1
    rec_max=$(jget max_ms <"$root/online-recovery-$r.out")
    rec_req=$(jget requests <"$root/online-recovery-$r.out")
    if [[ $st != 0 ]]; then
        kill -KILL $on 2>/dev/null
        rec_outcome=hung
    elif [[ -z "$rec_max" ]]; then
        rec_outcome=died
        rec_why="online: $(grep -m1 -i 'error' "$root/online-recovery-$r.out" | plain 100)"
    else
        rec_outcome=ok
    fi
}

check_recovery() {
    # An offline client SIGKILLed while its kernels run and its MPS context lives: MPS may
    # hang the other clients of its server until that client is terminated (mps-manager's
    # targeted recovery). Issue 8's target: the online neighbour makes progress again within
    # 1 s, read as the online client's slowest request over the run (a hang shows there whole).
    # An online client that exits with a CUDA error instead was torn down by the MPS server's
    # own handling of a fatal GPU error (its log says which client it blamed). The monitor's
    # state is checked before each kill: a run on a GPU the monitor disabled proves nothing (its
    # offline client is evicted). GPU_CHECK_RECOVERY_RUNS repeats it (default 1); the row gives
    # the worst run. GPU_CHECK_RECOVERY_SIGTERM_FIRST=<ms>: the kubelet's end of a container
    # that outlives its terminationGracePeriodSeconds, SIGTERM (the client ignores it), then
    # SIGKILL <ms> later; the shim, told the grace by XCUDA_KILL_GRACE_MS, may drain the
    # kernels before the kill (a plain kill tore an H200's online neighbour down in 12 of 20).
    local secs=$(( quick ? 4 : 8 )) runs=${GPU_CHECK_RECOVERY_RUNS:-1} r ev
    local term_ms=${GPU_CHECK_RECOVERY_SIGTERM_FIRST:-} del_ms=${GPU_CHECK_RECOVERY_DELETION:-}
    local worst="" hung=0 died=0 disabled=0 total_req=0 all=() why=""
    local slog="$root/mps-log/server.log" fatal0 fatal off_env=("${shim_env[@]}")
    local rec_outcome rec_max rec_req rec_why rec_online named=0
    # GPU_CHECK_RECOVERY_NO_SHIM=1: the offline client without the shim (is a fault the shim's?)
    [[ -n "${GPU_CHECK_RECOVERY_NO_SHIM:-}" ]] && off_env=(env)
    # Through the same env as the shim's settings: read by a shimmed client, by no other.
    [[ -n $term_ms ]] && off_env+=(XCUDA_KILL_GRACE_MS="$term_ms")
    # A pod's spec grace far longer than its deletion's, and the file the deletion is written to.
    [[ -n $del_ms ]] && off_env+=(XCUDA_KILL_GRACE_MS=600000 XCUDA_TERMINATION_FILE="$root/termination")
    fatal0=$(grep -c 'encountered a fatal GPU error' "$slog" 2>/dev/null)
    need_manager recovery || return
    echo '{ "group": "gpu-check" }' >"$root/xcuda.json"
    for r in $(seq "$runs"); do
        past_deadline && { runs=$(( r - 1 )); break; } # cut short: the row counts the runs made
        if ! grep -q '"state": *"healthy"' "$root/run/state.json" 2>/dev/null; then
            disabled=$(( disabled + 1 )); all+=("not-healthy")
            why="monitor state before run $r: $(grep -o '"state": *"[a-z]*"' "$root/run/state.json" | head -1)"
            sleep 2; continue
        fi
        recovery_run "$r" "${off_env[@]}"
        case $rec_outcome in
            hung) hung=$(( hung + 1 )); all+=(hung); continue ;;
            died)
                died=$(( died + 1 )); all+=(died); why=$rec_why
                # What mps-manager's recovery of a fatal error rests on: the server's log names
                # each client it tore down (`Client {PID: N} encountered a fatal GPU error`).
                sleep 0.5
                grep -q "Client {PID: $rec_online} encountered a fatal GPU error" "$slog" 2>/dev/null && named=$(( named + 1 ))
                continue ;;
            notrun) disabled=$(( disabled + 1 )); all+=(not-run); why=$rec_why; continue ;;
        esac
        all+=("$rec_max")
        isnum "$rec_req" && total_req=$(( total_req + rec_req ))
        if [[ -z "$worst" ]] || "$py" -c "import sys; sys.exit(0 if $rec_max > $worst else 1)"; then worst=$rec_max; fi
    done
    ev=$(grep -c 'recovery done' "$root/mps-manager.log")
    fatal=$(( $(grep -c 'encountered a fatal GPU error' "$slog" 2>/dev/null) - ${fatal0:-0} ))
    local what="$runs offline client(s) SIGKILLed holding a context under MPS"
    [[ -n "${GPU_CHECK_RECOVERY_NO_SHIM:-}" ]] && what="$what (without the shim)"
    [[ -n $term_ms ]] && what="$what (SIGTERM, then SIGKILL after $term_ms ms)"
    [[ -n $del_ms ]] && what="$what (no SIGTERM: the pod's deletion written, then SIGKILL after $del_ms ms)"
    [[ -n "${GPU_CHECK_RECOVERY_TERMINATE_FIRST:-}" ]] && what="$what (terminate_client first)"
    local each="slowest request per run (ms): ${all[*]}; $total_req requests; mps-manager recoveries: $ev; MPS server fatal GPU errors: $fatal${why:+; $why}"
    if [[ $hung != 0 ]]; then
        row recovery FAIL "online hung in $hung of $runs" "$what: no summary from the online client $(( secs + 30 )) s later; $each"
    elif [[ $died != 0 ]]; then
        row recovery FAIL "online torn down in $died of $runs" "$what: the online client exited with a CUDA error (the MPS server's fatal-error teardown); server.log named the torn-down online client in $named of $died; $each"
    elif [[ $disabled != 0 || -z "$worst" ]]; then
        row recovery FAIL "$disabled of $runs not run" "$what: the monitor did not report the GPU healthy, or the offline client never ran; $each"
    elif "$py" -c "import sys; sys.exit(0 if $worst <= 1000 else 1)"; then
        row recovery PASS "slowest online request ${worst} ms" "$what: the neighbour went on within 1 s; $each"
    elif "$py" -c "import sys; sys.exit(0 if $worst <= 5000 else 1)"; then
        row recovery INFO "slowest online request ${worst} ms" "$what: over the 1 s target, yet it went on; $each"
    else
        row recovery FAIL "slowest online request ${worst} ms" "$what: the online neighbour stalled for seconds; $each"
    fi
}

# --- an MPS server ended, its control daemon kept ------------------------------------------
check_server_restart() {
    local h b server new daemon reply gone_ms="" t0 i
    local ctl=(tmo 15 nvidia-cuda-mps-control)
    "${as_user[@]}" env "$py" "$client" hold 1 >"$root/srv-a.out" 2>"$root/srv-a.err" &
    h=$!; pids+=($h)
    for _ in $(seq 100); do grep -q holding "$root/srv-a.out" 2>/dev/null && break; sleep 0.1; done
    server=$(echo get_server_list | "${ctl[@]}" 2>/dev/null | head -n 1 | tr -dc '0-9')
    daemon=$(tr -dc '0-9' 2>/dev/null <"$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid")
    if [[ -z "$server" || -z "$daemon" ]]; then
        stop_pids $h
        row server-restart FAIL "-" "no MPS server (${server:-none}) or control daemon (${daemon:-none}) to look at: $(tail -n 1 "$root/srv-a.err" | plain)"
        return
    fi
    t0=$(date +%s%N)
    reply=$(echo "shutdown_server $server -f" | "${ctl[@]}" 2>&1 | plain 120)
    for i in $(seq 500); do
        [[ -e /proc/$server ]] || { gone_ms=$(( ($(date +%s%N) - t0) / 1000000 )); break; }
        sleep 0.01
    done
    stop_pids $h
    "${as_user[@]}" env "$py" "$client" hold 1 >"$root/srv-b.out" 2>"$root/srv-b.err" &
    b=$!; pids+=($b)
    for _ in $(seq 150); do grep -q holding "$root/srv-b.out" 2>/dev/null && break; kill -0 $b 2>/dev/null || break; sleep 0.1; done
    new=$(echo get_server_list | "${ctl[@]}" 2>/dev/null | head -n 1 | tr -dc '0-9')
    stop_pids $b
    local what="shutdown_server $server -f${reply:+ (reply: $reply)}"
    if [[ -z "$gone_ms" ]]; then
        row server-restart FAIL "server $server still running 5 s later" "$what: mps-manager falls back to a full reset on this host"
    elif [[ ! -e /proc/$daemon ]]; then
        row server-restart FAIL "the control daemon exited with it" "$what: server gone in $gone_ms ms, daemon $daemon gone too"
    elif ! grep -q holding "$root/srv-b.out" 2>/dev/null || [[ -z "$new" || "$new" == "$server" ]]; then
        row server-restart FAIL "no new server for the next client" "$what: server gone in $gone_ms ms, daemon $daemon kept; next client: $(tail -n 1 "$root/srv-b.err" | plain) (servers: ${new:-none})"
    else
        row server-restart PASS "server ended in $gone_ms ms, daemon kept" "$what; the next client got server $new from daemon $daemon"
    fi
}

# --- how many clients one MPS server takes -------------------------------------------------
check_mps_clients() {
    # Clients holding a context are started one after another under MPS until one is refused
    # (or GPU_CHECK_MPS_CLIENTS, default 64, hold one): the emulator refuses the 49th on SM 7.0
    # and later (nvidia-cuda-mps-control(1)); a real server that takes fewer would mean the
    # emulator allows what MPS refuses (FAIL), one that takes more is INFO.
    local n=${GPU_CHECK_MPS_CLIENTS:-64} emu_limit=48 i h held=0 refused="" blocked=0 hs=()
    (( quick )) && n=52
    for i in $(seq "$n"); do
        "${as_user[@]}" env "$py" "$client" hold 1 >"$root/mpsc-$i.out" 2>"$root/mpsc-$i.err" &
        h=$!; pids+=($h); hs+=($h)
        local k got=""
        for k in $(seq 300); do
            if grep -q holding "$root/mpsc-$i.out" 2>/dev/null; then got=held; break; fi
            if ! kill -0 $h 2>/dev/null; then got=exited; break; fi
            sleep 0.05
        done
        case "$got" in
            held) held=$(( held + 1 )) ;;
            exited) refused="client $i: $(grep -E '^[A-Za-z]*Error' "$root/mpsc-$i.err" | tail -n 1 | plain 120)"; break ;;
            *) blocked=$i; break ;;
        esac
    done
    stop_pids "${hs[@]}" # 10 s for all of them, then SIGKILL
    local what="clients holding a context at once under one MPS server"
    if (( blocked )); then
        row mps-clients INFO "$held held; client $blocked waited 15 s" "$what: the next one neither got a context nor was refused"
    elif [[ -z "$refused" ]]; then
        row mps-clients INFO "all $held held" "$what: none of $n refused (the emulator refuses the $(( emu_limit + 1 ))th)"
    elif (( held < emu_limit )); then
        row mps-clients FAIL "$held held, then refused" "$what: $refused; the emulator takes $emu_limit (it would allow what MPS refuses)"
    else
        row mps-clients PASS "$held held, then refused" "$what: $refused (emulator: $emu_limit, then CUresult 808)"
    fi
}

echo "gpu-check on $label (binaries: $bin_dir, $bin_note)" >&2
past_deadline() { (( deadline > 0 && SECONDS >= deadline )); }
picked() { # whether --only names one of "$@" (every check without --only)
    local c
    [[ -z $only ]] && return 0
    for c in "$@"; do [[ ",$only," == *",$c,"* ]] && return 0; done
    return 1
}
want() { # whether check $1 runs: picked (--only) and, with --deadline, still in time
    picked "$1" || return 1
    if past_deadline; then
        row "$1" SKIP "-" "not reached: the --deadline of $deadline s had passed"
        return 1
    fi
    current=$1
}
if picked throttle throttle-cap node; then
    # The offline client's solo rate, before the monitor runs: an unregistered process loading
    # the GPU is online demand to the monitor (it would drive it to Overlimit and hold it there).
    tmo 120 "$bin_dir/offline" --duration $(( quick ? 3 : 6 )) --json --report-interval 0 >"$root/off-alone.out" 2>&1
fi
solo_rate=$(offline_rate "$root/off-alone.out" 2>/dev/null)
current=monitor # what a FAIL row names if the kit stops between checks
if start_monitor; then
    want monitor-cpu && check_monitor_cpu
    want nvml-cost && check_nvml_cost
    want quota && check_quota
    want torch-quota && check_torch_quota
    want pool-keep && check_pool_keep
    want stack-limit && check_stack_limit
    want capture-mem && check_capture_mem
    want small-allocs && check_small_allocs
    want throttle && check_throttle
    if ! picked "${mps_checks[@]}"; then
        : # no check picked needs MPS: none started
    elif current=mps-start; start_mps; then
        # MPS alone, no mps-manager: a row measures the same in a whole run and in an --only.
        want mps-server && check_mps_server
        want throttle-cap && check_throttle_cap
        want exit && check_exit
        # Under mps-manager (root: compute mode EXCLUSIVE_PROCESS), started by the first of these.
        want fence && check_fence
        want shm && check_shm
        want pipe-ro && check_pipe_ro
        want node && check_node
        want recovery && check_recovery
        # MPS alone again: mps-manager would take server-restart's deliberate server shutdown
        # for a crash (a recovery, perhaps a full reset), and the row would blame MPS for it.
        if picked server-restart mps-clients && [[ -n "${mgr_up:-}" ]] && ! past_deadline; then
            current=mps-restart
            stop_mps_manager || echo "gpu-check: MPS did not serve again after mps-manager stopped: $mps_why" >&2
        fi
        if [[ -n "${mps_up:-}" && -z "$mps_why" ]]; then
            want server-restart && check_server_restart
            want mps-clients && check_mps_clients
        else
            for c in server-restart mps-clients; do picked $c && row $c SKIP "-" "MPS not serving after mps-manager stopped: $mps_why"; done
        fi
    else
        for c in "${mps_checks[@]}"; do
            [[ $c == exit ]] || ! picked "$c" || row "$c" SKIP "-" "$mps_why"
        done
        want exit && check_exit # without MPS: its row says so
    fi
    # Last: an unshimmed launch loop is online load to the monitor, which may hold the GPU after it.
    want launch-cost && check_launch_cost
else
    row monitor FAIL "-" "sysmonitor did not reach Healthy: $(tail -n 3 "$root/sysmonitor.log" | plain 300)"
fi

print_table
exit "$failed"
