"""The two scripts every Docker sandbox command runs with: the wrapper and the killer.

Why separate: they are programs for the container (``sh`` and ``python3`` inside the image), not
code of the daemon; keeping them apart makes both easier to read. See docker_provider.py.
"""

# Every process in a container carries CHITAL_EXEC: "idle" (container env) for the container's own
# processes, a fresh marker per exec (inherited by all it starts, even after setsid). The killer
# SIGKILLs what carries a given marker and whatever shed its environment (``env -i``) to hide. It is
# one process that never forks, because a fork bomb may hold every process slot; it repeats until
# nothing is left. With an exit code it exits with it silently, else it reports "left=N".
KILLER = """
import os, signal, sys, time
mark, me = ("CHITAL_EXEC=" + sys.argv[1]).encode(), os.getpid()
def doomed(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                return False
        with open("/proc/%d/environ" % pid, "rb") as f:
            env = f.read().split(b"\\0")
    except (OSError, IndexError):
        return False
    return mark in env or not any(e.startswith(b"CHITAL_EXEC=") for e in env)
def scan():
    return [int(d) for d in os.listdir("/proc") if d.isdigit() and int(d) not in (1, me) and doomed(int(d))]
for _ in range(50):
    pids = scan()
    if not pids:
        break
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
    time.sleep(0.02)
if len(sys.argv) > 2:
    sys.exit(int(sys.argv[2]))
print("left=%d" % len(scan()))
"""
# Runs the user's command, then makes sure nothing it started survives, as with the local
# provider. Fast path, no fork: only init, the idle process and this shell exist. Otherwise the
# shell becomes the killer (exec, not fork) and exits with the command's status.
WRAPPER = (
    'k=$2; bash -c "$1" 2>&1; rc=$?; set -- /proc/[0-9]*; [ $# -le 3 ] && exit $rc; '
    'exec python3 -c "$k" "$CHITAL_EXEC" "$rc"'
)
