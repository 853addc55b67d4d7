#!/bin/sh
# Runs inside ../shared/vm (Linux 6.12 with CONFIG_LATENCYTOP): the same work measured by the
# kernel's /proc/latency_stats and by `latprof stats`.
#   truth.sh MODE DELAY   MODE: lazy|normal   DELAY: on|off (the scheduler's DELAY_DEQUEUE)
# Between the kernel's clear and its read the shell forks only the workloads, so both tools see
# the same sleeps.
MODE=${1:-lazy}
DELAY=${2:-off}
if ! grep -q " /mnt " /proc/mounts && [ -b /dev/vda ]; then
    # busybox mke2fs makes ext2; a real disk gives fsync real D-state waits.
    mke2fs -q /dev/vda > /dev/null 2>&1 && mount /dev/vda /mnt
fi
if [ "$DELAY" = off ]; then
    echo NO_DELAY_DEQUEUE > /sys/kernel/debug/sched/features || exit 1
fi
latprof --mode="$MODE" stats --duration 900s > /tmp/lp.txt 2> /tmp/lp.err &
LP=$!
i=0
while ! grep -q attached /tmp/lp.err; do
    sleep 0.2; i=$((i + 1))
    if [ $i -gt 600 ]; then echo "latprof did not attach"; cat /tmp/lp.err; exit 1; fi
done
sleep 1
echo clear > /proc/latency_stats
latprof-workload sleep --count 100 --interval 1ms
latprof-workload fsync --count 20 --dir /mnt
latprof-workload pingpong --count 200
# Children that exit with a direct read in flight: they sleep in exit_aio after exit_mm,
# without a memory map, where latencytop keeps a sleep out of the global table.
latprof-workload exit-aio --count 20 --dir /mnt
while read -r line; do echo "$line"; done < /proc/latency_stats > /tmp/kernel.txt
kill -INT $LP
wait $LP
echo "=== kernel"
cat /tmp/kernel.txt
echo "=== latprof"
cat /tmp/lp.txt
echo "=== latprof stderr"
cat /tmp/lp.err
echo "=== end"
