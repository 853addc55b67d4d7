#!/bin/sh
# Runs inside ../shared/vm on any of its kernels (tests/vm_kernels.rs boots each once): the
# checks latprof must pass on every kernel it supports. Prints "=== NAME" sections; the test
# parses them. Every latprof run is stopped with SIGINT, as a user would.
echo "=== uname"
uname -r

# attached, finished: tests/vm/lib.sh (copied in beside this script).
. /work/lib.sh

# step WHAT: a progress line with the guest's uptime (the test ignores "+++" lines), so a run
# that stops shows where.
step() {
    echo "+++ $1 at $(cut -d' ' -f1 /proc/uptime)s"
}

# A watchdog: all of this takes about 30 s here; if it has not finished after 300 s, say where
# every task waits and end the guest now instead of at run.sh's 15-minute limit.
(
    sleep 300
    echo "=== watchdog: still running after 300 s"
    cat /proc/loadavg
    for d in /proc/[0-9]*; do
        echo "$(basename "$d") $(cut -d' ' -f2,3 "$d/stat" 2> /dev/null) wchan=$(cat "$d/wchan" 2> /dev/null)"
        grep -h . "$d/stack" 2> /dev/null | head -12
    done
    dmesg | tail -40
    echo "VM-SCRIPT-END rc=99"
    poweroff -f
) &
WATCHDOG=$!

# read(2)'s number, as /proc/PID/syscall shows it: 0 on x86-64, 63 on arm64 (the generic table).
case "$(uname -m)" in aarch64) NR_READ=63 ;; *) NR_READ=0 ;; esac

# blocked PID: waits until the workload PID sleeps in a read of stdin (the go line, or the end
# of file after its work), so that a latprof started after this sees none of the workload's
# start: not the shell opening the fifo for it, not its exec, not that read's start. A count
# that takes every sleep of the process needs it. /proc/PID/syscall names the call only once
# the task is off its CPU, so that sleep's switch is counted by then.
blocked() {
    i=0
    until [ "$(cat /proc/$1/comm 2> /dev/null)" = latprof-workloa ] \
        && [ "$(cut -d' ' -f1,2 /proc/$1/syscall 2> /dev/null)" = "$NR_READ 0x0" ] \
        && grep -q '^State:.S' /proc/$1/status 2> /dev/null; do
        sleep 0.05; i=$((i + 1))
        if [ $i -gt 2000 ]; then echo "workload $1 never blocked reading its stdin"; exit 1; fi
    done
}

# switches PID: the voluntary context switches of all of PID's threads so far.
switches() {
    cat /proc/$1/task/*/status | awk '/^voluntary_ctxt_switches:/ { n += $2 } END { print n }'
}

# asleep PID: waits until every thread of PID sleeps (state S) off its CPU (/proc's syscall file
# names the call only then), so that each one's last switch is counted in `switches`.
asleep() {
    i=0
    while :; do
        all=yes
        for t in /proc/$1/task/*; do
            case "$(cut -d' ' -f1 $t/syscall 2> /dev/null)" in
                ''|running) all=no ;;
            esac
            grep -q '^State:.S' $t/status 2> /dev/null || all=no
        done
        [ $all = yes ] && return
        sleep 0.05; i=$((i + 1))
        if [ $i -gt 2000 ]; then echo "workload $1 never slept in all its threads"; exit 1; fi
    done
}

step nanosleep
# 1. The nanosleep exact count, in both modes: 100 sleeps of 2 ms of one process (--pid),
#    every sleep counted (--all-sleeps), the workload timing its own sleeps.
for MODE in lazy normal; do
    mkfifo /tmp/go.$MODE
    latprof-workload --wait --hold sleep --count 100 --interval 2ms < /tmp/go.$MODE > /tmp/w.$MODE &
    W=$!
    latprof --mode $MODE --all-sleeps stats --pid $W --duration 900s > /tmp/s.$MODE 2> /tmp/e.$MODE &
    LP=$!
    attached /tmp/e.$MODE $LP
    echo go > /tmp/go.$MODE
    wait $W
    kill -INT $LP
    wait $LP; RC=$?
    echo "=== nanosleep $MODE rc"; echo $RC
    echo "=== nanosleep $MODE"; cat /tmp/s.$MODE
    echo "=== nanosleep $MODE stderr"; cat /tmp/e.$MODE
    echo "=== nanosleep $MODE workload"; cat /tmp/w.$MODE
done

step pingpong
# 2. A pipe ping-pong between two processes on two CPUs (--apart), both alive (--hold) when
#    latprof reads: each side's pipe waits under its own process.
mkfifo /tmp/go.pp
latprof-workload --wait --hold pingpong --count 200 --processes --apart --named < /tmp/go.pp > /tmp/w.pp &
W=$!
exec 3> /tmp/go.pp
blocked $W
latprof --all-sleeps --wakers stats --format json --duration 900s > /tmp/s.pp 2> /tmp/e.pp &
LP=$!
attached /tmp/e.pp $LP
echo go >&3
finished /tmp/w.pp "ping-pong"
echo "=== pingpong pids"
echo "$W"
kill -INT $LP
wait $LP; RC=$?
echo "=== pingpong rc"; echo $RC
exec 3>&-
wait $W
echo "=== pingpong"; cat /tmp/s.pp
echo "=== pingpong stderr"; cat /tmp/e.pp
echo "=== pingpong workload"; cat /tmp/w.pp

step udp
# 2b. UDP on loopback: each receive is ended by the network softirq (in the sender's context,
#     or on PREEMPT_RT in its task with softirqs counted there), the sender's nanosleeps by
#     the timer.
ip link set lo up 2> /dev/null || ifconfig lo 127.0.0.1 up
latprof --all-sleeps --wakers stats --format json --duration 900s > /tmp/s.u 2> /tmp/e.u &
LP=$!
attached /tmp/e.u $LP
latprof-workload --hold udp --count 50 --interval 2ms < /dev/null > /tmp/w.u &
W=$!
wait $W
echo "=== udp pid"; echo "$W"
kill -INT $LP
wait $LP; RC=$?
echo "=== udp rc"; echo $RC
echo "=== udp"; cat /tmp/s.u
echo "=== udp stderr"; cat /tmp/e.u
echo "=== udp workload"; cat /tmp/w.u

step fsync
# 3. fsync on the scratch disk (/mnt, ext4), its process only: its waits are uninterruptible
#    (spikes' K column) and sit under fsync's backtrace (stats); the workload counts every
#    sleep of its loop.
mkfifo /tmp/go.fs
latprof-workload --wait --hold fsync --count 20 --dir /mnt < /tmp/go.fs > /tmp/w.fs &
W=$!
exec 6> /tmp/go.fs
blocked $W
latprof --all-sleeps stats --pid $W --format json --duration 900s > /tmp/s.fs 2> /tmp/e.fs &
LP=$!
latprof --all-sleeps spikes --pid $W --spike 1us > /tmp/k.fs 2> /tmp/ke.fs &
LK=$!
attached /tmp/e.fs $LP
attached /tmp/ke.fs $LK
# The workload's voluntary switches from here (asleep in its first read of stdin, which latprof
# did not see begin) to its last read of stdin (asleep, seen begin but not end): every one of
# them in between is a sleep latprof counts, or one it says it left out. The workload's own
# count cannot be the window: the kernel can switch it out (a PREEMPT_RT spinlock) between
# its first read's wakeup and its count, or while it prints "done".
V0=$(switches $W)
echo go >&6
finished /tmp/w.fs "fsync"
asleep $W
V1=$(switches $W)
kill -INT $LP $LK
wait $LP; RS=$?
wait $LK; RK=$?
exec 6>&-
wait $W
echo "=== fsync rc"; echo "$RS $RK"
echo "=== fsync"; cat /tmp/s.fs
echo "=== fsync stderr"; cat /tmp/e.fs
echo "=== fsync spikes"; cat /tmp/k.fs
echo "=== fsync spikes stderr"; cat /tmp/ke.fs
echo "=== fsync workload"; cat /tmp/w.fs
echo "=== fsync switches"; echo "$V0 $V1"

step chains
# 3b. Wait chains (--chains): a reader's pipe waits behind the fsyncs of the process that writes
#     the pipe, on the scratch disk (/mnt, ext4).
#     The workload stays (reading its stdin, a fifo) until latprof has read its numbers: its
#     process's own.
latprof --all-sleeps --chains stats --format json --duration 900s > /tmp/s.ch 2> /tmp/e.ch &
LP=$!
attached /tmp/e.ch $LP
mkfifo /tmp/go.ch
latprof-workload --hold chain2 --count 20 --dir /mnt < /tmp/go.ch > /tmp/w.ch &
W=$!
exec 7> /tmp/go.ch
finished /tmp/w.ch "chain2"
echo "=== chains pid"; echo "$W"
kill -INT $LP
wait $LP; RC=$?
exec 7>&-
wait $W
echo "=== chains rc"; echo $RC
echo "=== chains"; cat /tmp/s.ch
echo "=== chains stderr"; cat /tmp/e.ch
echo "=== chains workload"; cat /tmp/w.ch

step spikes
# 4. spikes for known long sleeps: 5 nanosleeps of 30 ms over a 20 ms threshold.
latprof --all-sleeps --wakers --spike 20ms spikes > /tmp/k.long 2> /tmp/ke.long &
LK=$!
attached /tmp/ke.long $LK
latprof-workload --hold sleep --count 5 --interval 30ms < /dev/null > /tmp/w.long
kill -INT $LK
wait $LK; RC=$?
echo "=== spikes rc"; echo $RC
echo "=== spikes workload"; cat /tmp/w.long
echo "=== spikes"; cat /tmp/k.long
echo "=== spikes stderr"; cat /tmp/ke.long

step counters
# 5. stats --counters over a ping-pong (its process only, every sleep): the pipeline counters,
#    the variant loaded, and latprof's own kernel time per program run on this kernel.
mkfifo /tmp/go.c
latprof-workload --wait --hold pingpong --count 2000 < /tmp/go.c > /tmp/w.c &
W=$!
exec 5> /tmp/go.c
blocked $W
latprof --all-sleeps stats --counters --pid $W --duration 900s > /tmp/s.c 2> /tmp/e.c &
LP=$!
attached /tmp/e.c $LP
step "counters: attached"
# As for fsync: the switches from the first read's sleep to the last ones (this thread's read of
# stdin, the other's wait to be released).
V0=$(switches $W)
echo go >&5
finished /tmp/w.c "ping-pong"
asleep $W
V1=$(switches $W)
step "counters: ping-pong done"
kill -INT $LP
wait $LP; RC=$?
exec 5>&-
wait $W
echo "=== counters rc"; echo $RC
echo "=== counters"; cat /tmp/s.c
echo "=== counters stderr"; cat /tmp/e.c
echo "=== counters workload"; cat /tmp/w.c
echo "=== counters switches"; echo "$V0 $V1"

step ustacks
# 5a. User backtraces (issue 17): the programs load with the user walk on this kernel, and a
#     ping-pong's pipe waits carry the workload's frames, named (Rust, demangled).
mkfifo /tmp/go.us
latprof-workload --wait --hold pingpong --count 200 --processes --apart --print-stack < /tmp/go.us > /tmp/w.us &
W=$!
exec 4> /tmp/go.us
blocked $W
latprof --user-stacks --all-sleeps stats --pid $W --format json --duration 900s > /tmp/s.us 2> /tmp/e.us &
LP=$!
attached /tmp/e.us $LP
echo go >&4
finished /tmp/w.us "ping-pong"
kill -INT $LP
wait $LP; RC=$?
exec 4>&-
wait $W
echo "=== ustacks rc"; echo $RC
echo "=== ustacks"; cat /tmp/s.us
echo "=== ustacks stderr"; cat /tmp/e.us
echo "=== ustacks workload"; cat /tmp/w.us

for S in server server-fp; do
    [ -x /work/$S ] || continue
    step "ustacks $S"
    # 5a''. A C server (tests/fixtures/ustacks/server.c, static, where the test copies it in:
    #       the arm64 guests'), its pipe reads under main -> serve_requests ->
    #       wait_for_request -> read: `server` built without frame pointers (unwound through
    #       the tables from the syscall wrapper, a leaf whose caller is in the link register,
    #       out), `server-fp` with frame pointers and no unwind tables of its own (its frames
    #       walked by frame pointer between the C library's, which have tables).
    mkfifo /tmp/go.$S
    /work/$S 200 2000 wait < /tmp/go.$S > /tmp/w.$S &
    W=$!
    exec 4> /tmp/go.$S
    latprof --user-stacks --all-sleeps stats --pid $W --format json --duration 900s > /tmp/s.$S 2> /tmp/e.$S &
    LP=$!
    attached /tmp/e.$S $LP
    echo go >&4
    exec 4>&-
    wait $W; WRC=$?
    kill -INT $LP
    wait $LP; RC=$?
    echo "=== ustacks $S rc"; echo $RC $WRC
    echo "=== ustacks $S"; cat /tmp/s.$S
    echo "=== ustacks $S stderr"; cat /tmp/e.$S
    echo "=== ustacks $S workload"; cat /tmp/w.$S
done


step "ustacks record"
# 5a'. The same user walk in record's programs (top's and serve's: histograms, run-queue
#      waits), the whole machine: the same variant loads, with no fallback stats has not.
latprof --user-stacks --all-sleeps record -o /tmp/r.us --duration 2s > /dev/null 2> /tmp/e.usr
RC=$?
echo "=== ustacks record rc"; echo $RC
echo "=== ustacks record stderr"; cat /tmp/e.usr

step cgroups
# 5b. Cgroups (issue 15): two cgroups (one named like a systemd service), a nanosleep workload
#     moved into each before it starts, `stats --by cgroup`; beside it, on the same workloads,
#     `--cgroup` on the first one in normal mode (the kernel's filter, and normal mode's exit
#     merge into the per-cgroup table). The cgroup2 mount is read from /proc/mounts, and made
#     where the guest has none.
CG=$(awk '$3 == "cgroup2" { print $2; exit }' /proc/mounts)
if [ -z "$CG" ]; then
    CG=/sys/fs/cgroup
    mkdir -p $CG && mount -t cgroup2 none $CG
fi
mkdir "$CG/lp-a.service" "$CG/lp-b"
mkfifo /tmp/go.cga /tmp/go.cgb
latprof-workload --wait --hold sleep --count 60 --interval 2ms < /tmp/go.cga > /tmp/w.cga &
WA=$!
latprof-workload --wait --hold sleep --count 30 --interval 2ms < /tmp/go.cgb > /tmp/w.cgb &
WB=$!
echo $WA > "$CG/lp-a.service/cgroup.procs"
echo $WB > "$CG/lp-b/cgroup.procs"
latprof --all-sleeps stats --by cgroup --duration 900s > /tmp/s.cg 2> /tmp/e.cg &
LP=$!
latprof --mode normal --cgroup "$CG/lp-a.service" --all-sleeps stats --by cgroup --duration 900s > /tmp/s.cgf 2> /tmp/e.cgf &
LPF=$!
attached /tmp/e.cg $LP
attached /tmp/e.cgf $LPF
echo go > /tmp/go.cga
echo go > /tmp/go.cgb
wait $WA $WB
kill -INT $LP $LPF
wait $LP; RC=$?
wait $LPF; RCF=$?
echo "=== cgroups rc"; echo $RC
echo "=== cgroups"; cat /tmp/s.cg
echo "=== cgroups stderr"; cat /tmp/e.cg
echo "=== cgroup filter rc"; echo $RCF
echo "=== cgroup filter"; cat /tmp/s.cgf
echo "=== cgroup filter stderr"; cat /tmp/e.cgf
echo "=== cgroups workload a"; cat /tmp/w.cga
echo "=== cgroups workload b"; cat /tmp/w.cgb
rmdir "$CG/lp-a.service" "$CG/lp-b"

step reject
# 6. A program the verifier rejects: one error that names it and quotes the verifier, and the
#    whole log in a file.
latprof stats --debug-force-reject --duration 1s > /dev/null 2> /tmp/e.rej; RC=$?
echo "=== reject rc"; echo $RC
echo "=== reject"; cat /tmp/e.rej
echo "=== reject log"
LOG=$(sed -n 's/.*whole verifier log: \([^ ]*\)$/\1/p' /tmp/e.rej | tail -1)
# The log's last line before the verifier's statistics.
if [ -n "$LOG" ] && [ -f "$LOG" ]; then
    grep -v -e '^verification time' -e '^stack depth' -e '^processed ' -e '^$' "$LOG" | tail -1
else
    echo "no log file: '$LOG'"
fi

step unloaded
# 7. Every program unloaded once latprof is gone (the kernel frees them a moment later).
i=0
while latprof-workload loaded-programs | grep -q .; do
    sleep 0.5; i=$((i + 1))
    if [ $i -gt 20 ]; then break; fi
done
echo "=== loaded programs"
latprof-workload loaded-programs
kill $WATCHDOG
echo "=== end"
