#!/bin/sh
# Runs inside ../shared/vm booted with --smp 2 --append nohz_full=1 (CPU 1 is nohz_full, with
# context tracking): latprof's tick counters while one task spins alone on CPU 1.
echo "=== sysfs nohz_full"
cat /sys/devices/system/cpu/nohz_full
latprof stats --counters --duration 900s > /tmp/c.txt 2> /tmp/c.err &
LP=$!
i=0
while ! grep -qs attached /tmp/c.err; do
    sleep 0.2; i=$((i + 1))
    if [ $i -gt 600 ]; then echo "latprof did not attach"; cat /tmp/c.err; exit 1; fi
done
latprof-workload spin --time 4s --cpu 1 --syscall-every 20000
kill -INT $LP
wait $LP
echo "=== counters"
cat /tmp/c.txt
cat /tmp/c.err
