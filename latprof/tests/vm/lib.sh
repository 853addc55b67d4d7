# Helpers the VM scripts share (tests/vm/kernels.sh, tests/vm/node.sh), sourced from /work:
# common::vm::boot copies this file in beside each script.

# attached FILE PID: waits until the latprof writing its stderr to FILE has attached.
attached() {
    i=0
    while ! grep -qs attached "$1"; do
        if ! kill -0 "$2" 2> /dev/null; then
            echo "latprof exited before attaching:"; cat "$1"; exit 1
        fi
        sleep 0.2; i=$((i + 1))
        if [ $i -gt 900 ]; then echo "latprof did not attach:"; cat "$1"; exit 1; fi
    done
}

# finished FILE WHAT [PID]: waits until the workload writing its stdout to FILE says it is
# done (and, given its PID, fails at once if it exits first).
finished() {
    i=0
    while ! grep -qs done "$1"; do
        if [ -n "$3" ] && ! kill -0 "$3" 2> /dev/null; then
            echo "$2 exited:"; cat "$1"; exit 1
        fi
        sleep 0.2; i=$((i + 1))
        if [ $i -gt 900 ]; then echo "$2 did not finish:"; cat "$1"; exit 1; fi
    done
}
