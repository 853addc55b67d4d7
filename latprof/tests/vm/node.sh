#!/bin/sh
# Runs inside ../shared/vm (tests/vm_runtimes.rs boots Debian 12's kernel with node copied in):
# issue 32's Node case on a distro kernel. Node waits in Atomics.wait inside outer() ->
# middle() -> waitHere() (/work/sleep_in_three.js) while latprof counts its sleeps with user
# stacks; latprof is stopped (SIGINT, as a user would) while node still lives, so that it names
# the JavaScript frames from node's perf map. Prints "=== NAME" sections; the test parses them.
echo "=== uname"
uname -r

# attached, finished: tests/vm/lib.sh (copied in beside this script).
. /work/lib.sh

# Ends the guest if this has not finished after 300 s (it takes about a minute here).
(
    sleep 300
    echo "=== watchdog: still running after 300 s"
    ps
    echo "VM-SCRIPT-END rc=99"
    poweroff -f
) &

mkfifo /tmp/go
# In /tmp: V8 writes an isolate-*-v8.log where it runs.
cd /tmp
node --perf-basic-prof --interpreted-frames-native-stack /work/sleep_in_three.js 50 \
    < /tmp/go > /tmp/w.out 2>&1 &
N=$!
exec 7> /tmp/go
latprof --user-stacks --all-sleeps --stack-depth 127 stats --format json --duration 900s \
    --pid $N > /tmp/s.json 2> /tmp/e.txt &
LP=$!
attached /tmp/e.txt $LP
echo go >&7
finished /tmp/w.out node $N
kill -INT $LP
wait $LP; RC=$?
exec 7>&-
wait $N
echo "=== pid"; echo $N
echo "=== rc"; echo $RC
echo "=== stats"; cat /tmp/s.json
echo "=== stats stderr"; cat /tmp/e.txt
echo "=== node"; cat /tmp/w.out
