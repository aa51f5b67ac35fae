# Default guest command (run by /init with busybox sh). Runs the lab's
# stalltrace-kernel-checks in each of $MODES (set by the host above this
# script: auto, and raw_tp on the run's oldest and newest kernels, on the
# newest only the checks in $RAW_TP_ONLY) when it is in the image (it prints
# its own STALLTRACE-MATRIX JSON lines, and its auto `cli/check` the output
# and time of a plain `stalltrace check`); or else times a plain `stalltrace
# check` and a short `stalltrace run` as a smoke test.
M() { echo "STALLTRACE-MATRIX $*"; }
up() { cut -d' ' -f1 /proc/uptime; }
B=/usr/local/bin
DISK=${STALLTRACE_TEST_DISK:-/dev/nvme0n1}

if [ -x $B/stalltrace-kernel-checks ]; then
    for mode in ${MODES:-auto raw_tp}; do
        only=
        [ "$mode" = raw_tp ] && [ -n "${RAW_TP_ONLY:-}" ] && only="--only $RAW_TP_ONLY"
        t0=$(up)
        # shellcheck disable=SC2086 # $only: the flag and its words
        $B/stalltrace-kernel-checks --stalltrace $B/stalltrace --sqlservr $B/sqlservr \
            --sqlclient $B/sqlclient --disk "$DISK" --mode $mode $only
        M time "checks-$mode" "$t0" "$(up)" "$?"
    done
    exit 0
fi

# Fallback smoke test: the verdicts are exit codes and record counts only.
t0=$(up)
$B/stalltrace check > /tmp/check.out 2>&1
rc=$?
while IFS= read -r l; do M out check "$l"; done < /tmp/check.out
M time check "$t0" "$(up)" "$rc"
[ "$rc" = 0 ] && v=pass || v=fail
M "{\"check\":\"stalltrace-check\",\"family\":\"all\",\"mode\":\"auto\",\"verdict\":\"$v\",\"detail\":\"exit $rc\"}"
for mode in ${MODES:-auto raw_tp}; do
    # Some disk reads while it records, so the block family has something to see.
    (sleep 1; dd if="$DISK" of=/dev/null bs=64k count=2000 iflag=direct 2>/dev/null) &
    t0=$(up)
    $B/stalltrace run --duration 3s --probe-mode $mode > /tmp/run.jsonl 2> /tmp/run.err
    rc=$?
    wait
    n=$(wc -l < /tmp/run.jsonl)
    kinds=$(sed -n 's/.*"type":"\([a-z_]*\)".*/\1/p' /tmp/run.jsonl | sort | uniq -c | tr -s ' ' | tr '\n' ',')
    tail -n 5 /tmp/run.err
    [ "$rc" = 0 ] && [ "$n" -gt 0 ] && v=pass || v=fail
    M "{\"check\":\"stalltrace-run-3s\",\"family\":\"all\",\"mode\":\"$mode\",\"verdict\":\"$v\",\"detail\":\"exit $rc, $n records:$kinds\"}"
    M time "run-$mode" "$t0" "$(up)" "$rc"
done
