"""What the kernel lets this process do (effective capabilities, rlimits), read from
/proc/self/status and /proc/self/limits, never guessed from the uid: the engine's memory
report and the control plane's placement and doctor all say why an mlock or a real-time
policy was refused from this one reading.
"""
from __future__ import annotations

import re
import resource
from dataclasses import dataclass


class _Proc:
    """This host's files (fastpath.control.host.Host has the same read(), under any root)."""
    root = "/"

    def read(self, p: str) -> str | None:
        try:
            with open(p) as f:
                return f.read()
        except OSError:
            return None


# capability numbers from linux/capability.h
CAP_IPC_LOCK = 14
CAP_SYS_NICE = 23
UNLIMITED = resource.RLIM_INFINITY
RT_FIX = ("run with CAP_SYS_NICE (docker/podman: --cap-add SYS_NICE; systemd: "
          "AmbientCapabilities=CAP_SYS_NICE; or setcap cap_sys_nice+ep on the interpreter), or "
          "'<user> - rtprio {p}' in /etc/security/limits.conf")
MEMLOCK_FIX = ("run with CAP_IPC_LOCK (docker/podman: --cap-add IPC_LOCK), or raise the limit: "
               "ulimit -l unlimited, docker --ulimit memlock=-1, systemd LimitMEMLOCK=infinity, or "
               "'<user> - memlock unlimited' in /etc/security/limits.conf")


@dataclass
class Privileges:
    """What the kernel lets this process do, read from /proc/self/status and /proc/self/limits
    (through the Host, so a fake tree can play root-without-CAP_SYS_NICE). None: not visible."""
    uid: int | None
    cap_eff: int | None
    rtprio: int | None          # soft RLIMIT_RTPRIO
    memlock: int | None         # soft RLIMIT_MEMLOCK in bytes, UNLIMITED for unlimited

    def has(self, cap: int) -> bool | None:
        return None if self.cap_eff is None else bool(self.cap_eff >> cap & 1)

    def _who(self) -> str:
        return "root (uid 0)" if self.uid == 0 else f"uid {self.uid}" if self.uid is not None else "this process"

    def realtime(self, priority: int) -> tuple:
        """(allowed, why): may sched_setscheduler(SCHED_FIFO/RR, priority) succeed? The kernel
        allows it with CAP_SYS_NICE, or without it up to the soft RLIMIT_RTPRIO."""
        nice = self.has(CAP_SYS_NICE)
        lim = "unknown" if self.rtprio is None else ("unlimited" if self.rtprio == UNLIMITED
                                                     else str(self.rtprio))
        if nice:
            return True, f"{self._who()} holds CAP_SYS_NICE"
        if self.rtprio is not None and (self.rtprio == UNLIMITED or self.rtprio >= priority):
            return True, f"RLIMIT_RTPRIO {lim} allows priority {priority}"
        if nice is None and self.rtprio is None:
            return False, "capabilities and RLIMIT_RTPRIO not visible"
        capnote = ("capabilities not visible" if nice is None else
                   f"{self._who()} without CAP_SYS_NICE in its effective set"
                   + (" (a container's default)" if self.uid == 0 else ""))
        return False, f"{capnote}, and RLIMIT_RTPRIO is {lim} (< {priority})"

    def memory_lock(self, nbytes: int) -> tuple:
        """(allowed, why): may mlock(nbytes) succeed? CAP_IPC_LOCK lifts RLIMIT_MEMLOCK."""
        ipc = self.has(CAP_IPC_LOCK)
        lim = ("unknown" if self.memlock is None else
               "unlimited" if self.memlock == UNLIMITED else f"{self.memlock} B")
        if ipc:
            return True, f"{self._who()} holds CAP_IPC_LOCK"
        if self.memlock is not None and (self.memlock == UNLIMITED or self.memlock >= nbytes):
            return True, f"RLIMIT_MEMLOCK {lim} covers {nbytes} B"
        if ipc is None and self.memlock is None:
            return False, "capabilities and RLIMIT_MEMLOCK not visible"
        capnote = ("capabilities not visible" if ipc is None else
                   f"{self._who()} without CAP_IPC_LOCK in its effective set")
        return False, f"{capnote}, and RLIMIT_MEMLOCK is {lim} (< {nbytes} B)"


def _limit(text: str | None, name: str):
    """Soft limit `name` from /proc/<pid>/limits: int, UNLIMITED, or None."""
    for line in (text or "").splitlines():
        if line.startswith(name):
            cols = re.split(r"\s{2,}", line.strip())
            if len(cols) >= 2:
                v = cols[1]
                if v == "unlimited":
                    return UNLIMITED
                return int(v) if v.isdigit() else None
    return None


def read_privileges(host=None) -> Privileges:
    host = host or _Proc()
    status = host.read("/proc/self/status") or ""
    uid = cap = None
    for line in status.splitlines():
        k, _, v = line.partition(":")
        if k == "Uid" and v.split():
            uid = int(v.split()[1])                   # effective uid
        elif k == "CapEff" and v.strip():
            cap = int(v.strip(), 16)
    limits = host.read("/proc/self/limits")
    rtprio, memlock = _limit(limits, "Max realtime priority"), _limit(limits, "Max locked memory")
    if limits is None and host.root == "/":
        # /proc hidden (some sandboxes): the rlimits are still ours to ask for
        rtprio = resource.getrlimit(resource.RLIMIT_RTPRIO)[0]
        memlock = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]
    return Privileges(uid, cap, rtprio, memlock)
